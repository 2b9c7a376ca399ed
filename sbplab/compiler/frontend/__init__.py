"""The frontend: a torch.nn.Module (traced with torch.fx) or a hand-built graph becomes a logical graph."""
