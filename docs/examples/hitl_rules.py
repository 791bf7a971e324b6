"""The usage guide's "Configuring HITL Rules" example, verbatim, then what the rules decide."""

from harombe.security.hitl import HITLGate, RiskClassifier
from harombe.security.sandbox_risk import get_sandbox_hitl_rules
# Get default sandbox rules
rules = get_sandbox_hitl_rules()
# Add custom rule
from harombe.security.hitl import HITLRule, RiskLevel
custom_rule = HITLRule(
tools=["code_execute"],
risk=RiskLevel.HIGH,
conditions=[
{"param": "code", "matches": r"(?i)crypto|bitcoin|mining"}
],
timeout=30,
description="Code mentioning cryptocurrency (suspicious)",
)
rules.append(custom_rule)
# Apply to HITL gate
classifier = RiskClassifier(rules=rules)
hitl_gate = HITLGate(classifier=classifier)

# --- not in the guide: what the gate's classifier makes of three calls ---------------------
from harombe.security.hitl import Operation  # noqa: E402

for code in ("print('hello')", "import json\nstart_bitcoin_mining()", "import os\nos.system('id')"):
    op = Operation("code_execute", {"language": "python", "code": code})
    assessment = classifier.assess(op)
    print(f"{assessment.risk} timeout={assessment.timeout_s:g}s", "|", *map(str, assessment.reasons))
