// x W^T written as torch-mlir writes nn.Linear (and TOSA's lowering a transpose): a
// linalg.transpose of W (N x K) feeding a plain linalg.matmul. The CPU strategy
// generalizes the transpose and, with up to 17 rows, folds it into the matmul's map.
func.func @linear(%x: tensor<?x?xf32> {jit.dims = ["M", "K"]}, %w: tensor<?x?xf32> {jit.dims = ["N", "K"]}) -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %m = tensor.dim %x, %c0 : tensor<?x?xf32>
  %n = tensor.dim %w, %c0 : tensor<?x?xf32>
  %k = tensor.dim %w, %c1 : tensor<?x?xf32>
  %te = tensor.empty(%k, %n) : tensor<?x?xf32>
  %wt = linalg.transpose ins(%w : tensor<?x?xf32>) outs(%te : tensor<?x?xf32>) permutation = [1, 0]
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty(%m, %n) : tensor<?x?xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<?x?xf32>) -> tensor<?x?xf32>
  %r = linalg.matmul ins(%x, %wt : tensor<?x?xf32>, tensor<?x?xf32>) outs(%acc : tensor<?x?xf32>) -> tensor<?x?xf32>
  return %r : tensor<?x?xf32>
}
