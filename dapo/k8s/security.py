"""The Pod Security Standard level a namespace needs for the chart's values, and why, as the chart's NOTES say it
(``dapo.podSecurityProfile`` in ``charts/dapo/templates/_security.tpl`` decides; this reads what it rendered):
``dapo doctor`` compares it with the namespace's ``pod-security.kubernetes.io/enforce`` label before the install.
tests/test_security.py holds the level against the Pod Security Standards' own rules on every rendered pod.
"""

from __future__ import annotations

import re

LEVEL = re.compile(r'the pods need the Pod Security Standard "(restricted|baseline|privileged)"')
REASONS = "(a \"restricted\" namespace refuses these pods) because of:"


def pod_security_profile(text: str) -> tuple[str, list[str]]:
    """The Pod Security Standard level the namespace needs ("restricted", "baseline" or "privileged") and why, from
    the text of the chart's NOTES as Helm rendered them. Raises ValueError when NOTES name no level (the chart and
    this reader disagree)."""
    m = LEVEL.search(text)
    if not m:
        raise ValueError("the chart's NOTES name no Pod Security Standard level")
    reasons: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Pod Security:") and line.endswith(REASONS):
            for item in lines[i + 1:]:
                if not item.startswith("  - "):
                    break
                reasons.append(item[4:])
    return m.group(1), reasons
