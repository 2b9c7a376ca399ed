"""The training graph: reverse-mode autodiff and optimizer updates as ordinary graph ops."""
