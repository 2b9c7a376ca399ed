"""SBP deduction: strategies and hints, placements and stages, and the one signature choice per op."""
