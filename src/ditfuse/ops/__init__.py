"""ditfuse's ops, one module per family: plan (validate), launch settings, launch, the public
function, and its ``torch.library`` op with a fake. The public functions are re-exported by
``ditfuse``; this package re-exports nothing (a function named like its module would hide it)."""
