// linalg named ops with `?` dims: transpose, elementwise, reduce; f16 in and out.
// exp(x + transpose(y)) and the row sums of x (accumulated in f16, as written).
module {
  func.func @named(%x: tensor<?x?xf16>, %y: tensor<?x?xf16>) -> (tensor<?x?xf16>, tensor<?xf16>) {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %n = tensor.dim %x, %c0 : tensor<?x?xf16>
    %m = tensor.dim %x, %c1 : tensor<?x?xf16>
    %e = tensor.empty(%n, %m) : tensor<?x?xf16>
    %t = linalg.transpose ins(%y : tensor<?x?xf16>) outs(%e : tensor<?x?xf16>) permutation = [1, 0]
    %e2 = tensor.empty(%n, %m) : tensor<?x?xf16>
    %s = linalg.add ins(%x, %t : tensor<?x?xf16>, tensor<?x?xf16>) outs(%e2 : tensor<?x?xf16>) -> tensor<?x?xf16>
    %ex = linalg.exp ins(%s : tensor<?x?xf16>) outs(%e2 : tensor<?x?xf16>) -> tensor<?x?xf16>
    %zero = arith.constant 0.0 : f16
    %er = tensor.empty(%n) : tensor<?xf16>
    %acc = linalg.fill ins(%zero : f16) outs(%er : tensor<?xf16>) -> tensor<?xf16>
    %red = linalg.reduce ins(%x : tensor<?x?xf16>) outs(%acc : tensor<?xf16>) dimensions = [1]
      (%in: f16, %init: f16) {
        %a = arith.addf %in, %init : f16
        linalg.yield %a : f16
      }
    return %ex, %red : tensor<?x?xf16>, tensor<?xf16>
  }
}
