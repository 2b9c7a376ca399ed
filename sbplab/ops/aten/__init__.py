"""ATen ops in the registry: made on first use from their names, with SBP rules by op family."""

from .calls import Slot
from .opdef import make_aten_opdef
from .rules import RULES, Rule, has_rule, register_rule, rule_for

__all__ = ["RULES", "Rule", "Slot", "has_rule", "make_aten_opdef", "register_rule", "rule_for"]
