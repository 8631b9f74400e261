"""How many bytes a training step holds, and when: parameters, activations, backward's moments, the analytic
estimate, the FakeTensor simulation and its extrapolation to depth, layer sets, offload, CUDA workspaces."""
