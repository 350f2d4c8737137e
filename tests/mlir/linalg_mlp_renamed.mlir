#a = affine_map<(i, j) -> (i, j)>
#b = affine_map<(i, j) -> (j)>
// a comment that changes nothing
func.func @other_name(%input: tensor<?x16xf32> {jit.dims = ["N", 16]}, %weight: tensor<16x?xf32> {jit.dims = [16, "H"]}, %bias_vec: tensor<?xf32> {jit.dims = ["H"]}) -> tensor<?x?xf32> {
  %zero_f = arith.constant 0.0 : f32
  %idx1 = arith.constant 1 : index
  %idx0 = arith.constant 0 : index
  %rows = tensor.dim %input, %idx0 : tensor<?x16xf32>
  %cols = tensor.dim %weight, %idx1 : tensor<16x?xf32>
  %e1 = tensor.empty(%rows, %cols) : tensor<?x?xf32>
  %filled = linalg.fill ins(%zero_f : f32) outs(%e1 : tensor<?x?xf32>) -> tensor<?x?xf32>
  %prod = linalg.matmul ins(%input, %weight : tensor<?x16xf32>, tensor<16x?xf32>) outs(%filled : tensor<?x?xf32>) -> tensor<?x?xf32>
  %e2 = tensor.empty(%rows, %cols) : tensor<?x?xf32>
  %res = linalg.generic {indexing_maps = [#a, #b, #a], iterator_types = ["parallel", "parallel"]} ins(%prod, %bias_vec : tensor<?x?xf32>, tensor<?xf32>) outs(%e2 : tensor<?x?xf32>) {
  ^bb0(%p: f32, %q: f32, %r: f32):
    %sum = arith.addf %p, %q : f32
    %th = math.tanh %sum : f32
    linalg.yield %th : f32
  } -> tensor<?x?xf32>
  return %res : tensor<?x?xf32>
}
