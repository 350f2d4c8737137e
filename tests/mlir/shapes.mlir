// tensor.expand_shape / collapse_shape with dynamic dims, and results whose dims depend
// on two inputs: a concatenation (rows N + M) and an outer product (N x M).
module {
  func.func @reshape(%x: tensor<?x6xf32>) -> tensor<?x3xf32> {
    %c0 = arith.constant 0 : index
    %n = tensor.dim %x, %c0 : tensor<?x6xf32>
    %flat = tensor.collapse_shape %x [[0, 1]] : tensor<?x6xf32> into tensor<?xf32>
    %c2 = arith.constant 2 : index
    %n2 = arith.muli %n, %c2 : index
    %y = tensor.expand_shape %flat [[0, 1]] output_shape [%n2, 3] : tensor<?xf32> into tensor<?x3xf32>
    return %y : tensor<?x3xf32>
  }
  func.func @concat(%a: tensor<?x4xf32>, %b: tensor<?x4xf32>) -> tensor<?x4xf32> {
    %r = tensor.concat dim(0) %a, %b : (tensor<?x4xf32>, tensor<?x4xf32>) -> tensor<?x4xf32>
    return %r : tensor<?x4xf32>
  }
  func.func @outer(%a: tensor<?xf32>, %b: tensor<?xf32>) -> tensor<?x?xf32> {
    %c0 = arith.constant 0 : index
    %n = tensor.dim %a, %c0 : tensor<?xf32>
    %m = tensor.dim %b, %c0 : tensor<?xf32>
    %e = tensor.empty(%n, %m) : tensor<?x?xf32>
    %r = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i)>, affine_map<(i, j) -> (j)>, affine_map<(i, j) -> (i, j)>],
                         iterator_types = ["parallel", "parallel"]}
        ins(%a, %b : tensor<?xf32>, tensor<?xf32>) outs(%e : tensor<?x?xf32>) {
    ^bb0(%x: f32, %y: f32, %o: f32):
      %p = arith.mulf %x, %y : f32
      linalg.yield %p : f32
    } -> tensor<?x?xf32>
    return %r : tensor<?x?xf32>
  }
}
