// Read by tests/test_mlir_nn.c, which runs it against the same ops built with the C API.
func.func @a(%x: tensor<?x3x9x11xf32>, %w: tensor<5x3x3x3xf32>) -> tensor<?x5x2x3xf32> {
  %c0 = arith.constant 0 : index
  %n = tensor.dim %x, %c0 : tensor<?x3x9x11xf32>
  %z = arith.constant 0.0 : f32
  %ninf = arith.constant 0xFF800000 : f32
  %p = tensor.pad %x low[0, 0, 1, 1] high[0, 0, 1, 1] {
  ^bb0(%i0: index, %i1: index, %i2: index, %i3: index):
    tensor.yield %z : f32
  } : tensor<?x3x9x11xf32> to tensor<?x3x11x13xf32>
  %e = tensor.empty(%n) : tensor<?x5x5x6xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<?x5x5x6xf32>) -> tensor<?x5x5x6xf32>
  %c = linalg.conv_2d_nchw_fchw {dilations = dense<1> : tensor<2xi64>, strides = dense<2> : tensor<2xi64>} ins(%p, %w : tensor<?x3x11x13xf32>, tensor<5x3x3x3xf32>) outs(%f : tensor<?x5x5x6xf32>) -> tensor<?x5x5x6xf32>
  %win = tensor.empty() : tensor<2x2xf32>
  %e2 = tensor.empty(%n) : tensor<?x5x2x3xf32>
  %f2 = linalg.fill ins(%ninf : f32) outs(%e2 : tensor<?x5x2x3xf32>) -> tensor<?x5x2x3xf32>
  %m = linalg.pooling_nchw_max {dilations = dense<1> : tensor<2xi64>, strides = dense<2> : tensor<2xi64>} ins(%c, %win : tensor<?x5x5x6xf32>, tensor<2x2xf32>) outs(%f2 : tensor<?x5x2x3xf32>) -> tensor<?x5x2x3xf32>
  return %m : tensor<?x5x2x3xf32>
}
