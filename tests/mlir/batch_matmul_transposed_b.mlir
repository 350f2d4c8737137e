// linalg.batch_matmul reading B (batch x N x K) through (b, n, k): attention's q K^T
// with the keys stored as a key cache is. With few rows, or a long K, the CPU strategy
// plans it as a batch of dot products along k (plan_batch_dot); otherwise as a
// transpose of B and a plain batch_matmul (jit__cpu_normalize).
func.func @bmt(%a: tensor<?x?x?xf32> {jit.dims = ["B", "M", "K"]}, %b: tensor<?x?x?xf32> {jit.dims = ["B", "N", "K"]}) -> tensor<?x?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %nb = tensor.dim %a, %c0 : tensor<?x?x?xf32>
  %m = tensor.dim %a, %c1 : tensor<?x?x?xf32>
  %n = tensor.dim %b, %c1 : tensor<?x?x?xf32>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty(%nb, %m, %n) : tensor<?x?x?xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<?x?x?xf32>) -> tensor<?x?x?xf32>
  %r = linalg.batch_matmul indexing_maps = [affine_map<(b, m, n, k) -> (b, m, k)>, affine_map<(b, m, n, k) -> (b, n, k)>, affine_map<(b, m, n, k) -> (b, m, n)>] ins(%a, %b : tensor<?x?x?xf32>, tensor<?x?x?xf32>) outs(%acc : tensor<?x?x?xf32>) -> tensor<?x?x?xf32>
  return %r : tensor<?x?x?xf32>
}
