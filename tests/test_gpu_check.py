"""The GPU check (python -m dapo.cluster.gpu_check, the GPU workers' postStart hook and the helm test GPU pod) against a
stand-in nvidia-smi that answers from the real `nvidia-smi -q` output of GPU nodes (tests/fixtures/nvidia-smi, each
file's source in its README): a driver too old, a GPU count that differs, torch without CUDA; a healthy H100 node, a
past error already remapped (GH200) and retired pages of a V100 node pass; a pending row remap (A10, and one GPU of
an A100 node) is refused naming that GPU; the other faults NVIDIA documents (a failed remap, uncorrectable ECC errors
since the driver loaded, the SRAM threshold, pending or exhausted retired pages) are refused on the healthy outputs
with that one value changed, while lifetime counts alone pass."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from dapo.cluster import gpu_check

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"
# nvidia-smi(1): the sections `-d ROW_REMAPPER,ECC,PAGE_RETIREMENT` selects
SELECTED = ("ECC Mode", "ECC Errors", "Retired Pages", "Remapped Rows")


def query_rows(text: str) -> list[str]:
    """What `nvidia-smi --query-gpu=index,uuid,pci.bus_id,driver_version,name --format=csv,noheader` prints on the
    node whose `-q` is ``text`` (its GPUs in the order -q lists them, by PCI bus id as nvidia-smi indexes them)."""
    driver = re.search(r"^Driver Version\s+: (\S+)", text, re.M).group(1)
    rows = []
    for i, block in enumerate(re.split(r"^GPU (?=[0-9A-F]+:)", text, flags=re.M)[1:]):
        bus = block.split("\n", 1)[0].strip()
        uuid = re.search(r"^\s+GPU UUID\s+: (\S+)", block, re.M).group(1)
        name = re.search(r"^\s+Product Name\s+: (.+)$", block, re.M).group(1).strip()
        rows.append(f"{i}, {uuid}, {bus}, {driver}, {name}")
    return rows


def selected_sections(text: str) -> str:
    """`nvidia-smi -q -d ROW_REMAPPER,ECC,PAGE_RETIREMENT`: the log's header, each GPU's line and only the selected
    sections (no name, no UUID)."""
    out, keep = [], True
    for line in text.splitlines():
        top = line.startswith("    ") and not line.startswith("     ")
        if line.startswith("GPU ") or not line.startswith(" "):
            keep = True
        elif top:
            keep = line.strip().split(":")[0].strip() in SELECTED
        if keep:
            out.append(line)
    return "\n".join(out) + "\n"


def stand_in(tmp_path: Path, rows: list[str], query: str = "", rc: int = 0, q_rc: int = 0) -> str:
    """An `nvidia-smi` that prints ``rows`` for --query-gpu (then exits ``rc``) and ``query`` for exactly the GPU
    check's -q -d call (then exits ``q_rc``); any other call exits 2, as nvidia-smi does for an unknown -d name."""
    (tmp_path / "rows.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "q.txt").write_text(query)
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"""#!/bin/sh
case "$*" in
  "--query-gpu={gpu_check.QUERY_FIELDS} --format=csv,noheader") /bin/cat {tmp_path}/rows.csv ;;
  "-q -d ROW_REMAPPER,ECC,PAGE_RETIREMENT") /bin/cat {tmp_path}/q.txt; exit {q_rc} ;;
  *) echo "Invalid combination of input arguments: $*" >&2; exit 2 ;;
esac
exit {rc}
""")
    exe.chmod(0o755)
    return str(exe)


def node(tmp_path: Path, text: str) -> str:
    return stand_in(tmp_path, query_rows(text), selected_sections(text))


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def edit(text: str, gpu: int, pattern: str, value: str) -> str:
    """``text`` with one line of GPU ``gpu``'s block (``pattern``: a regex with a group for the value, matching
    exactly one line there) set to ``value``."""
    parts = re.split(r"(?=^GPU [0-9A-F]+:)", text, flags=re.M)
    block, n = re.subn(pattern, lambda m: m.group(0)[: m.start(1) - m.start(0)] + value, parts[gpu + 1], flags=re.M)
    assert n == 1, (pattern, n)
    parts[gpu + 1] = block
    return "".join(parts)


# --- the driver, the count, torch -------------------------------------------------------------------------------------

H100_ROWS = [f"{i}, GPU-{i:08d}-0000-0000-0000-000000000000, 00000000:{i:02X}:00.0, {{}}, NVIDIA H100 80GB HBM3"
             for i in range(8)]


def test_gpu_check_refuses_a_driver_too_old_for_cuda_13(tmp_path):
    healthy = selected_sections(fixture("h100-x8-535.183.01.txt"))
    smi = stand_in(tmp_path, [r.format("550.54.15") for r in H100_ROWS], healthy)
    with pytest.raises(gpu_check.GpuCheckError, match=r"NVIDIA driver 550\.54\.15 is too old: .*needs driver >= 580"):
        gpu_check.check(580, 8, nvidia_smi=smi)
    text = fixture("h100-x8-535.183.01.txt").replace("535.183.01", "580.65.06")
    ok = node(tmp_path, text)
    assert gpu_check.check(580, 8, nvidia_smi=ok) == ("NVIDIA driver 580.65.06 (>= 580), 8 x NVIDIA H100 80GB HBM3, "
                                                      "no GPU memory fault")
    with pytest.raises(gpu_check.GpuCheckError, match=r"sees 8 GPU\(s\), expected 4"):
        gpu_check.check(580, 4, nvidia_smi=ok)
    with pytest.raises(gpu_check.GpuCheckError, match=r"nvidia-smi --query-gpu=.* failed \(exit 9\)"):
        gpu_check.check(580, nvidia_smi=stand_in(tmp_path, ["NVML: Driver/library version mismatch"], rc=9))
    with pytest.raises(gpu_check.GpuCheckError, match=r"printed 'NVML: Driver/library version mismatch', not 5"):
        gpu_check.check(580, nvidia_smi=stand_in(tmp_path, ["NVML: Driver/library version mismatch"]))


def test_gpu_check_cli_exits_1_with_the_reason_when_no_driver_is_mounted(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "dapo.cluster.gpu_check", "--min-driver", "580"], capture_output=True,
                         text=True, env=env, cwd=tmp_path)
    assert out.returncode == 1
    assert "gpu_check: nvidia-smi not found" in out.stderr and "runtimeClassName" in out.stderr
    node(tmp_path, fixture("a100-x4-555.42.02.txt").replace("555.42.02", "535.104.05"))
    out = subprocess.run([sys.executable, "-m", "dapo.cluster.gpu_check"], capture_output=True, text=True, env=env,
                         cwd=tmp_path)
    assert out.returncode == 1 and "NVIDIA driver 535.104.05 is too old" in out.stderr


def test_gpu_check_with_torch_reports_a_cuda_runtime_that_cannot_use_the_gpus(tmp_path):
    """nvidia-smi lists GPUs but torch cannot use them (here: the CPU build of torch) -> a named failure."""
    import torch

    smi = node(tmp_path, fixture("gh200-550.127.05.txt"))
    if torch.cuda.is_available():  # pragma: no cover - only on a GPU machine
        assert "torch" in gpu_check.check(550, torch_check=True, nvidia_smi=smi)
        return
    with pytest.raises(gpu_check.GpuCheckError, match=r"torch\.cuda\.is_available\(\) is False"):
        gpu_check.check(550, 1, torch_check=True, nvidia_smi=smi)


# --- GPU memory faults: the real outputs ------------------------------------------------------------------------------

@pytest.mark.parametrize("name, gpus, driver", [
    ("h100-x8-535.183.01.txt", "8 x NVIDIA H100 80GB HBM3", "535.183.01"),
    ("gh200-550.127.05.txt", "1 x NVIDIA GH200 480GB", "550.127.05"),  # its one lifetime error: remapped, applied
    ("v100-x8-550.127.05.txt", "8 x Tesla V100-SXM2-16GB", "550.127.05"),  # one page retired, none pending
])
def test_a_node_without_a_memory_fault_passes(tmp_path, name, gpus, driver):
    assert gpu_check.check(535, nvidia_smi=node(tmp_path, fixture(name))) == \
        f"NVIDIA driver {driver} (>= 535), {gpus}, no GPU memory fault"


def test_a_pending_row_remap_is_refused_naming_the_gpu_the_field_and_the_reset(tmp_path):
    with pytest.raises(gpu_check.GpuCheckError) as err:
        gpu_check.check(535, nvidia_smi=node(tmp_path, fixture("a10-535.129.03.txt")))
    assert str(err.value) == (
        "GPU memory fault: GPU 0 (GPU-73d12ef7-f589-f867-4259-c7090ab44736, 00000000:07:00.0): row remap pending "
        "(Remapped Rows: Pending: Yes; rows remapped: 4 uncorrectable, 0 correctable) -- a pending row remap is applied "
        "at the next GPU reset: drain the node, reset the GPU (nvidia-smi -r -i <index>) or reboot the node")


def test_one_gpu_of_a_node_with_a_pending_remap_is_the_one_named(tmp_path):
    """Four A100s: GPU 1 has a remap pending, two others one applied (not pending): only GPU 1 is named."""
    with pytest.raises(gpu_check.GpuCheckError) as err:
        gpu_check.check(550, 4, nvidia_smi=node(tmp_path, fixture("a100-x4-555.42.02.txt")))
    msg = str(err.value)
    assert msg.startswith("GPU memory fault: GPU 1 (GPU-72d87681-01db-370e-567d-41afcf20fad0, 00000000:9E:00.0): "
                          "row remap pending (Remapped Rows: Pending: Yes; rows remapped: 0 uncorrectable, 1 correctable)")
    assert msg.count("GPU memory fault") == 1 and msg.count("(GPU-") == 1


# --- GPU memory faults NVIDIA documents, each on a healthy output with the one value changed --------------------------

H100, V100 = "h100-x8-535.183.01.txt", "v100-x8-550.127.05.txt"
VOLATILE_H100 = r"^        Volatile\n(?:            .*\n)*?            {field}\s+: (0)$"
VOLATILE_V100 = r"^        Volatile\n(?:            .*\n|                .*\n)*?            Double Bit\s*\n(?:.*\n)*?" \
                r"                Total\s+: (0)$"
REFUSED = [
    # NVIDIA's RMA criterion (the row-remapping failure flag)
    (H100, r"^        Remapping Failure Occurred\s+: (No)$", "Yes",
     "row remapping failed (Remapped Rows: Remapping Failure Occurred: Yes)", "field diagnostic"),
    # uncorrectable errors since the driver loaded, DRAM and SRAM
    (H100, VOLATILE_H100.format(field="DRAM Uncorrectable"), "2",
     "uncorrectable ECC errors since the driver loaded (ECC Errors: Volatile: DRAM Uncorrectable: 2)", "reset the GPU"),
    (H100, VOLATILE_H100.format(field=r"SRAM Uncorrectable SEC-DED"), "1",
     "uncorrectable ECC errors since the driver loaded (ECC Errors: Volatile: SRAM Uncorrectable SEC-DED: 1)",
     "reboot the node"),
    # the SRAM RMA flag
    (H100, r"^            SRAM Threshold Exceeded\s+: (No)$", "Yes",
     "SRAM ECC error threshold exceeded (ECC Errors: Aggregate: SRAM Threshold Exceeded: Yes)", "replace the GPU"),
    # before Ampere: a double bit error since the driver loaded, pages pending, pages exhausted
    (V100, VOLATILE_V100, "1", "uncorrectable ECC errors since the driver loaded (ECC Errors: Volatile: Double Bit "
     "Total: 1)", "reset the GPU"),
    (V100, r"^        Pending Page Blacklist\s+: (No)$", "Yes",
     "retired pages pending (Retired Pages: Pending Page Blacklist: Yes)", "reboot it"),
    (V100, r"^        Single Bit ECC\s+: (\d+)$", "64",
     "retired pages at the 64 a GPU before Ampere can retire (Retired Pages: Single Bit ECC: 64, Double Bit ECC: 0)",
     "replace the GPU"),
]


@pytest.mark.parametrize("name, pattern, value, shown, todo", REFUSED, ids=[r[3].split(" (")[0] for r in REFUSED])
def test_each_memory_fault_nvidia_documents_is_refused_naming_the_gpu_the_field_and_what_to_do(
        tmp_path, name, pattern, value, shown, todo):
    text = fixture(name)
    gpu = 5
    bus, uuid = query_rows(text)[gpu].split(", ")[2], query_rows(text)[gpu].split(", ")[1]
    with pytest.raises(gpu_check.GpuCheckError) as err:
        gpu_check.check(535, 8, nvidia_smi=node(tmp_path, edit(text, gpu, pattern, value)))
    msg = str(err.value)
    assert msg.startswith(f"GPU memory fault: GPU {gpu} ({uuid}, {bus}): {shown} -- "), msg
    assert todo in msg.split(" -- ", 1)[1] and "drain the node" in msg
    from dapo.cluster.nodes import HARDWARE_TEXT

    assert HARDWARE_TEXT.search(msg), msg  # the follower reads the hook's event as the node's hardware fault


@pytest.mark.parametrize("name, pattern, value", [
    (H100, r"^        Aggregate\n(?:            .*\n)*?            DRAM Uncorrectable\s+: (0)$", "3"),  # lifetime only
    (H100, r"^        Correctable Error\s+: (0)$", "5"),  # rows remapped and applied: the remapper did its job
    (H100, VOLATILE_H100.format(field="DRAM Correctable"), "120"),  # corrected
    (V100, r"^        Single Bit ECC\s+: (\d+)$", "63"),  # one page left to retire
])
def test_lifetime_counts_and_corrected_errors_alone_pass(tmp_path, name, pattern, value):
    assert gpu_check.check(535, 8, nvidia_smi=node(tmp_path, edit(fixture(name), 5, pattern, value))).endswith(
        "no GPU memory fault")


def test_two_faulty_gpus_are_both_named_and_each_remedy_said_once(tmp_path):
    text = edit(fixture(H100), 2, r"^        Pending\s+: (No)$", "Yes")
    text = edit(text, 7, r"^        Pending\s+: (No)$", "Yes")
    text = edit(text, 7, r"^        Remapping Failure Occurred\s+: (No)$", "Yes")
    with pytest.raises(gpu_check.GpuCheckError) as err:
        gpu_check.check(535, nvidia_smi=node(tmp_path, text))
    found, todo = str(err.value).split(" -- ")
    assert re.findall(r"GPU (\d) \(", found) == ["2", "7"]
    assert "GPU 7 (GPU-" in found and "row remapping failed" in found.split(" | ")[1]
    assert todo.count("a pending row remap is applied") == 1 and todo.count("field diagnostic") == 1


def test_the_memory_query_asks_for_the_sections_nvidia_smi_documents_and_a_failure_is_named(tmp_path):
    """The stand-in answers only `-q -d ROW_REMAPPER,ECC,PAGE_RETIREMENT` (nvidia-smi(1), -d TYPE); a -q call that
    fails or prints no GPU block refuses the node naming the call."""
    text = fixture(H100)
    smi = stand_in(tmp_path, query_rows(text), "NVIDIA-SMI has failed because it couldn't communicate with the driver")
    with pytest.raises(gpu_check.GpuCheckError, match=r"nvidia-smi -q -d ROW_REMAPPER,ECC,PAGE_RETIREMENT printed no "
                                                      r"GPU block: .NVIDIA-SMI has failed"):
        gpu_check.check(535, nvidia_smi=smi)
    smi = stand_in(tmp_path, query_rows(text), "Unable to determine the device handle for GPU0000:53:00.0: Unknown "
                   "Error", q_rc=15)
    with pytest.raises(gpu_check.GpuCheckError, match=r"nvidia-smi -q -d ROW_REMAPPER,ECC,PAGE_RETIREMENT failed "
                                                      r"\(exit 15\): Unable to determine the device handle"):
        gpu_check.check(535, nvidia_smi=smi)
    assert gpu_check.MEMORY_QUERY == ["-q", "-d", "ROW_REMAPPER,ECC,PAGE_RETIREMENT"]


def test_the_postStart_hook_refuses_a_node_with_a_pending_remap(tmp_path):
    """The workers' hook as the kubelet runs it: exit 1, the reason on stderr (the pod's FailedPostStartHook event)."""
    node(tmp_path, fixture("a10-535.129.03.txt"))
    env = {**os.environ, "PATH": str(tmp_path), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "dapo.cluster.gpu_check", "--min-driver", "535"], capture_output=True,
                         text=True, env=env, cwd=tmp_path)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith("gpu_check: GPU memory fault: GPU 0 (GPU-73d12ef7-f589-f867-4259-c7090ab44736, "
                                 "00000000:07:00.0): row remap pending"), out.stderr
