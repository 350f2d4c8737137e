func.func @f(%x: tensor<?xf32>) -> tensor<?xf32> {
  %y = math.exp %x : tensor<?xf32>
  %z = arith.addf %y, %undefined : tensor<?xf32>
  return %z : tensor<?xf32>
}
