// linalg.matmul reading B (N x K) through a transposed map: x W^T with a PyTorch
// Linear's weight layout. Planned by the CPU strategy for any M (plan_matmul_bt).
func.func @mt(%a: tensor<?x?xf32> {jit.dims = ["M", "K"]}, %b: tensor<?x?xf32> {jit.dims = ["N", "K"]}) -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %m = tensor.dim %a, %c0 : tensor<?x?xf32>
  %n = tensor.dim %b, %c0 : tensor<?x?xf32>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty(%m, %n) : tensor<?x?xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<?x?xf32>) -> tensor<?x?xf32>
  %r = linalg.matmul indexing_maps = [affine_map<(m, n, k) -> (m, k)>, affine_map<(m, n, k) -> (n, k)>, affine_map<(m, n, k) -> (m, n)>] ins(%a, %b : tensor<?x?xf32>, tensor<?x?xf32>) outs(%acc : tensor<?x?xf32>) -> tensor<?x?xf32>
  return %r : tensor<?x?xf32>
}
