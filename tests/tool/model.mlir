// y = relu(x W + b) with a symbolic batch N: the tool test's model.
func.func @dense(%x: tensor<?x33xf32> {jit.dims = ["N", 33]}, %w: tensor<33x17xf32>,
                 %b: tensor<17xf32>) -> tensor<?x17xf32> {
  %c0 = arith.constant 0 : index
  %n = tensor.dim %x, %c0 : tensor<?x33xf32>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty(%n) : tensor<?x17xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<?x17xf32>) -> tensor<?x17xf32>
  %mm = linalg.matmul ins(%x, %w : tensor<?x33xf32>, tensor<33x17xf32>)
                      outs(%acc : tensor<?x17xf32>) -> tensor<?x17xf32>
  %y = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (j)>,
                                        affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%mm, %b : tensor<?x17xf32>, tensor<17xf32>) outs(%e : tensor<?x17xf32>) {
  ^bb0(%m: f32, %bias: f32, %o: f32):
    %s = arith.addf %m, %bias : f32
    %r = arith.maximumf %s, %zero : f32
    linalg.yield %r : f32
  } -> tensor<?x17xf32>
  return %y : tensor<?x17xf32>
}
