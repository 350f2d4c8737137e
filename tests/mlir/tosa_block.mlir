// A TOSA block as TFLite's exporter writes it (syntax after upstream MLIR's
// test/Conversion/TosaToLinalg tests, TOSA 1.0): batched matmul, bias add with
// broadcast, relu (clamp), a softmax over the last dim, transpose, reshape, tanh.
// B, M are dynamic; K = 8 and N = 4 are static.
module {
  func.func @block(%a: tensor<?x?x8xf32>, %w: tensor<?x8x4xf32>, %bias: tensor<1x1x4xf32>)
      -> tensor<?x?xf32> {
    %zp = "tosa.const"() <{values = dense<0.0> : tensor<1xf32>}> : () -> tensor<1xf32>
    %shift = "tosa.const"() <{values = dense<0> : tensor<1xi8>}> : () -> tensor<1xi8>
    %mm = tosa.matmul %a, %w, %zp, %zp : (tensor<?x?x8xf32>, tensor<?x8x4xf32>, tensor<1xf32>, tensor<1xf32>) -> tensor<?x?x4xf32>
    %add = tosa.add %mm, %bias : (tensor<?x?x4xf32>, tensor<1x1x4xf32>) -> tensor<?x?x4xf32>
    %relu = tosa.clamp %add {min_val = 0.0 : f32, max_val = 3.4028235e+38 : f32} : (tensor<?x?x4xf32>) -> tensor<?x?x4xf32>
    %mx = tosa.reduce_max %relu {axis = 2 : i32} : (tensor<?x?x4xf32>) -> tensor<?x?x1xf32>
    %sub = tosa.sub %relu, %mx : (tensor<?x?x4xf32>, tensor<?x?x1xf32>) -> tensor<?x?x4xf32>
    %ex = tosa.exp %sub : (tensor<?x?x4xf32>) -> tensor<?x?x4xf32>
    %sum = tosa.reduce_sum %ex {axis = 2 : i32} : (tensor<?x?x4xf32>) -> tensor<?x?x1xf32>
    %rcp = tosa.reciprocal %sum : (tensor<?x?x1xf32>) -> tensor<?x?x1xf32>
    %sm = tosa.mul %ex, %rcp, %shift : (tensor<?x?x4xf32>, tensor<?x?x1xf32>, tensor<1xi8>) -> tensor<?x?x4xf32>
    %tr = tosa.transpose %sm {perms = array<i32: 0, 2, 1>} : (tensor<?x?x4xf32>) -> tensor<?x4x?xf32>
    %shape = tosa.const_shape {values = dense<[-1, 4]> : tensor<2xindex>} : () -> !tosa.shape<2>
    %flat = tosa.reshape %tr, %shape : (tensor<?x4x?xf32>, !tosa.shape<2>) -> tensor<?x4xf32>
    %th = tosa.tanh %flat : (tensor<?x4xf32>) -> tensor<?x4xf32>
    %out = tensor.cast %th : tensor<?x4xf32> to tensor<?x?xf32>
    return %out : tensor<?x?xf32>
  }
}
