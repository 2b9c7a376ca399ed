"""Lowering: a physical graph becomes the runtime's actor plan (actors, registers, collective order)."""
