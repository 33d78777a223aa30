"""``fabric.*``: which runs must declare their network fabric, and the fabric check the training entrypoint starts
with -- the chart's rules in ``templates/_validate.tpl`` and the arguments in ``templates/rayjob-train.yaml``, with the
same messages.

Every training run of our trainer on more than one GPU node declares the fabric NCCL must use (a cloud file,
``-f values/eks-p5.yaml`` ..., or ``--set fabric.expect=...``; the chart lists it among the values still needed) and
checks it first (``fabric.check``, on by default):
without a declared fabric NCCL falls back to TCP sockets without an error, and a 16-node run trains for days several
times slower. One node, verl on CPU, the local backend and the reference runner (the upstream recipe, which has no
check) declare none; a declared fabric is then not checked.
"""

from __future__ import annotations

from typing import Any

from dapo.k8s.presets import ValuesError
from dapo.util.gofmt import q

# the cloud files that declare a fabric (values/<name>.yaml), as the refusal names them
CLOUD_FILES = ("eks-p5", "gke-a3-mega", "gke-a3-high", "gke-a3-ultra")


def checked(v: dict[str, Any], pl: dict[str, Any]) -> bool:
    """A run the check can run in: training in our trainer (``dapo train``) on verl's workers."""
    return bool(v["train"]["enabled"] and v["train"]["runner"] != "reference" and pl["backend"] != "local")


def multi_node(v: dict[str, Any], pl: dict[str, Any]) -> bool:
    """A run that must declare and check its fabric: our trainer on more than one GPU node."""
    return checked(v, pl) and not pl["cpu"] and int(pl["nodes"]) > 1


def check_fabric(v: dict[str, Any], pl: dict[str, Any]) -> None:
    """Refuse a multi-node GPU run that turns its fabric check off."""
    if multi_node(v, pl) and not v["fabric"]["check"]:
        raise ValuesError(
            f"fabric.check: preset {q(v['preset'])} runs on {int(pl['nodes'])} nodes x {int(pl['gpus'])} GPUs: every "
            "multi-node run checks its fabric first (about a minute, against days of training); set fabric.check: "
            "true (fabric.expect=socket trains over TCP, reported by the check)"
        )


def missing_fabric(v: dict[str, Any], pl: dict[str, Any]) -> list[str]:
    """The line of the chart's refusal of missing values for a multi-node GPU run that declares no fabric."""
    if not multi_node(v, pl) or v["fabric"]["expect"]:
        return []
    return [f"- fabric.expect: {int(pl['nodes'])} nodes x {int(pl['gpus'])} GPUs, no fabric declared (NCCL would "
            f"silently use TCP): -f values/<cloud>.yaml ({', '.join(CLOUD_FILES)}) or --set "
            "fabric.expect=ib|efa|tcpx|tcpxo|gib|socket (docs/fabric.md)"]


def entrypoint_args(v: dict[str, Any], pl: dict[str, Any]) -> list[str]:
    """``dapo train``'s fabric arguments: ``--fabric-check`` (a declared fabric, the check on, a run it can run in),
    the floor and the recheck token."""
    fab = v["fabric"]
    if not (fab["check"] and fab["expect"] and checked(v, pl)):
        return []
    args = [f"--fabric-check={fab['expect']}"]
    if fab.get("minBusBandwidthGBps") is not None:  # a null from the user removes the key (Helm)
        args.append(f"--fabric-min-busbw={float(fab['minBusBandwidthGBps']):g}")
    if fab.get("recheck"):
        args.append(f"--fabric-recheck={fab['recheck']}")
    return args
