// arith and math ops applied to whole tensors, as some exporters write them (no
// linalg.generic): y = exp(a + b) * tanh(a) - b, with the rows named N.
func.func @ew(%a: tensor<?x7xf32> {jit.dims = ["N", 7]},
              %b: tensor<?x7xf32> {jit.dims = ["N", 7]}) -> tensor<?x7xf32> {
  %s = arith.addf %a, %b : tensor<?x7xf32>
  %e = math.exp %s : tensor<?x7xf32>
  %t = math.tanh %a : tensor<?x7xf32>
  %p = arith.mulf %e, %t : tensor<?x7xf32>
  %y = arith.subf %p, %b : tensor<?x7xf32>
  return %y : tensor<?x7xf32>
}
