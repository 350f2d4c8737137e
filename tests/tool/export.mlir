// y = relu(x W + b), N symbolic: a graph of the C API as jit_graph_to_mlir exports it
// (the tool test's model for generic kernels and hot bindings; an export whose body is
// unchanged comes back as the graph it was made from).
func.func @dense(
    %x: tensor<?x33xf32> {jit.dims = ["N", 33]},
    %w: tensor<33x17xf32> {jit.dims = [33, 17]},
    %b: tensor<17xf32> {jit.dims = [17]}) -> (tensor<?x17xf32>) attributes {jit.graph = "jitml-graph-1 34fc9e6eb3efce18569018e872bf576b;s 4e;n 0 0 0 0 0 2 0 0 0 -2 33 78;n 0 0 0 0 0 2 0 0 0 33 17 77;n 0 0 0 0 0 1 0 0 0 17 62;n 2 0 2 0 1 2 0 0 0 -2 17;n 3 0 2 3 2 2 0 0 0 -2 17;n 14 0 1 4 0 2 0 0 0 -2 17;o 5"} {
  %idx0 = arith.constant 0 : index
  %idx1 = arith.constant 1 : index
  %idx2 = arith.constant 2 : index
  %idx3 = arith.constant 3 : index
  %idx4 = arith.constant 4 : index
  %idx5 = arith.constant 5 : index
  %idx6 = arith.constant 6 : index
  %idx7 = arith.constant 7 : index
  %in0_d0 = tensor.dim %x, %idx0 : tensor<?x33xf32>
  %v3_t0 = tensor.empty(%in0_d0) : tensor<?x17xf32>
  %v3_t1 = arith.constant 0.0 : f32
  %v3_t2 = linalg.fill ins(%v3_t1 : f32) outs(%v3_t0 : tensor<?x17xf32>) -> tensor<?x17xf32>
  %v3 = linalg.matmul ins(%x, %w : tensor<?x33xf32>, tensor<33x17xf32>) outs(%v3_t2 : tensor<?x17xf32>) -> tensor<?x17xf32>
  %v4_t0 = tensor.empty(%in0_d0) : tensor<?x17xf32>
  %v4 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%v3, %b : tensor<?x17xf32>, tensor<17xf32>) outs(%v4_t0 : tensor<?x17xf32>) {
  ^bb0(%in0: f32, %in1: f32, %out: f32):
    %t0 = arith.addf %in0, %in1 : f32
    linalg.yield %t0 : f32
  } -> tensor<?x17xf32>
  %v5_t0 = tensor.empty(%in0_d0) : tensor<?x17xf32>
  %v5 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%v4 : tensor<?x17xf32>) outs(%v5_t0 : tensor<?x17xf32>) {
  ^bb0(%in0: f32, %out: f32):
    %c0 = arith.constant 0.0 : f32
    %t0 = arith.maximumf %in0, %c0 : f32
    linalg.yield %t0 : f32
  } -> tensor<?x17xf32>
  return %v5 : tensor<?x17xf32>
}
