// Read by tests/test_mlir_nn.c, which runs it against the same ops built with the C API.
func.func @c(%x: tensor<?x6xf32>, %y: tensor<?x6xf32>, %t: tensor<1x10x6xf32>) -> (tensor<?x6xf16>, tensor<1x3x6xf32>) {
  %g = tosa.greater %x, %y : (tensor<?x6xf32>, tensor<?x6xf32>) -> tensor<?x6xi1>
  %s = tosa.select %g, %x, %y : (tensor<?x6xi1>, tensor<?x6xf32>, tensor<?x6xf32>) -> tensor<?x6xf32>
  %h = tosa.cast %s : (tensor<?x6xf32>) -> tensor<?x6xf16>
  %ids = "tosa.const"() <{values = dense<[[9, 0, 4]]> : tensor<1x3xi32>}> : () -> tensor<1x3xi32>
  %r = tosa.gather %t, %ids : (tensor<1x10x6xf32>, tensor<1x3xi32>) -> tensor<1x3x6xf32>
  return %h, %r : tensor<?x6xf16>, tensor<1x3x6xf32>
}
