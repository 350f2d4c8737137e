// linalg.batch_matmul with every dim dynamic: the CPU strategy plans it per concrete
// shape (a loop over the batch of tiled, vectorized 2-D matmuls).
func.func @bmm(%a: tensor<?x?x?xf32> {jit.dims = ["B", "M", "K"]}, %b: tensor<?x?x?xf32> {jit.dims = ["B", "K", "N"]}) -> tensor<?x?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %nb = tensor.dim %a, %c0 : tensor<?x?x?xf32>
  %m = tensor.dim %a, %c1 : tensor<?x?x?xf32>
  %n = tensor.dim %b, %c2 : tensor<?x?x?xf32>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty(%nb, %m, %n) : tensor<?x?x?xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<?x?x?xf32>) -> tensor<?x?x?xf32>
  %r = linalg.batch_matmul ins(%a, %b : tensor<?x?x?xf32>, tensor<?x?x?xf32>) outs(%acc : tensor<?x?x?xf32>) -> tensor<?x?x?xf32>
  return %r : tensor<?x?x?xf32>
}
