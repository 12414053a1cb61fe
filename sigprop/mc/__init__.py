"""PyTorch-free Monte Carlo checker: samples real activations and gradients with NumPy."""
