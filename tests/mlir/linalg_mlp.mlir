// A dense layer in linalg on tensors, as torch-mlir exports it: y = tanh(x W + b).
// N (batch) and H (hidden) are dynamic; `jit.dims` names them.
#map_id = affine_map<(d0, d1) -> (d0, d1)>
#map_row = affine_map<(d0, d1) -> (d1)>
module {
  func.func @forward(%x: tensor<?x16xf32> {jit.dims = ["N", 16]},
                     %w: tensor<16x?xf32> {jit.dims = [16, "H"]},
                     %b: tensor<?xf32> {jit.dims = ["H"]}) -> tensor<?x?xf32> {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %zero = arith.constant 0.0 : f32
    %n = tensor.dim %x, %c0 : tensor<?x16xf32>
    %h = tensor.dim %w, %c1 : tensor<16x?xf32>
    %init = tensor.empty(%n, %h) : tensor<?x?xf32>
    %acc = linalg.fill ins(%zero : f32) outs(%init : tensor<?x?xf32>) -> tensor<?x?xf32>
    %mm = linalg.matmul ins(%x, %w : tensor<?x16xf32>, tensor<16x?xf32>)
                        outs(%acc : tensor<?x?xf32>) -> tensor<?x?xf32>
    %out = tensor.empty(%n, %h) : tensor<?x?xf32>
    %y = linalg.generic {indexing_maps = [#map_id, #map_row, #map_id],
                         iterator_types = ["parallel", "parallel"]}
        ins(%mm, %b : tensor<?x?xf32>, tensor<?xf32>) outs(%out : tensor<?x?xf32>) {
    ^bb0(%v: f32, %bias: f32, %o: f32):
      %s = arith.addf %v, %bias : f32
      %t = math.tanh %s : f32
      linalg.yield %t : f32
    } -> tensor<?x?xf32>
    return %y : tensor<?x?xf32>
  }
}
