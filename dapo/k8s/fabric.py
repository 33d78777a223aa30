"""``fabric.*``: which runs must declare their network fabric, and the fabric check the training entrypoint starts
with -- the chart's rules in ``templates/_validate.tpl`` and the arguments in ``templates/rayjob-train.yaml``, with the
same messages.

Every training run of our trainer on more than one GPU node declares the fabric NCCL must use (a cloud file,
``-f values/eks-p5.yaml`` ..., or ``--set fabric.expect=...``) and checks it first (``fabric.check``, on by default):
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
    """Refuse a multi-node GPU run that declares no fabric, or turns its check off."""
    if not multi_node(v, pl):
        return
    fab, where = v["fabric"], f"preset {q(v['preset'])} runs on {int(pl['nodes'])} nodes x {int(pl['gpus'])} GPUs"
    if not fab["expect"]:
        files = ", ".join(f"-f values/{f}.yaml" for f in CLOUD_FILES)
        raise ValuesError(
            f"fabric.expect: {where} and declares no network fabric: NCCL would train over TCP sockets without an "
            f"error. Add your cloud's file ({files}) or declare the fabric: --set fabric.expect=ib (InfiniBand / "
            "RoCE), efa, tcpx, tcpxo, gib, or socket (TCP: checked and reported, never refused); docs/fabric.md"
        )
    if not fab["check"]:
        raise ValuesError(
            f"fabric.check: {where}: every multi-node run checks its fabric first (about a minute, against days of "
            "training); set fabric.check: true (fabric.expect=socket trains over TCP, reported by the check)"
        )


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
