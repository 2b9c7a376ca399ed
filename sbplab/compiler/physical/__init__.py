"""The physical graph: every rank's op instances and boxing steps, its memory, an in-process executor."""
