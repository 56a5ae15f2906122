"""ditfuse's ``@triton.jit`` and Gluon kernels, one module per kernel family. No launch logic
here: the ops in ``ditfuse.ops`` validate, pick launch settings and launch these."""
