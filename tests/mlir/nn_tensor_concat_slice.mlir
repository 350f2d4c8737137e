// Read by tests/test_mlir_nn.c, which runs it against the same ops built with the C API.
func.func @d(%a: tensor<?x2x5xf32>, %b: tensor<?x3x5xf32>) -> tensor<?x2x2xf32> {
  %cat = tensor.concat dim(1) %a, %b : (tensor<?x2x5xf32>, tensor<?x3x5xf32>) -> tensor<?x5x5xf32>
  %c0 = arith.constant 0 : index
  %n = tensor.dim %a, %c0 : tensor<?x2x5xf32>
  %s = tensor.extract_slice %cat[0, 1, 1] [%n, 2, 2] [1, 2, 2] : tensor<?x5x5xf32> to tensor<?x2x2xf32>
  return %s : tensor<?x2x2xf32>
}
