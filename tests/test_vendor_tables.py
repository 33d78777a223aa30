"""The per-cloud vendor tables of docs/fabric.md (one table per values/<cloud>.yaml) are the single
source of truth for what each cloud file sets: every row -- setting, value, the vendor's source with its version and
date -- is compared here with what Helm and scripts/render.py render for the cloud's two-node check (values/smoke.yaml
+ values/smoke-2node.yaml + the cloud file), or, for the image rows, with docker/. A rendered value that drifts from
its row, a row whose value nothing renders, or a setting of the cloud file without a row fails.

A row's setting is one of (a backticked cell; values in backticks too, `(unset)` = absent):
  env NAME                     the variable on every Ray container (head and workers)
  container NAME FIELD[.SUB]   a field of a worker pod container or native sidecar (lists joined with ", ")
  mount CONTAINER VOLUME       where CONTAINER mounts VOLUME, "(read-only)" appended when it is
  volume NAME                  "hostPath PATH" or "emptyDir" of a worker pod volume
  annotation KEY               a worker pod annotation
  interfaces                   networking.gke.io/interfaces as "eth0=default eth1=vpc1 ..."
  devices CONTAINER            the devices.gke.io/container.CONTAINER paths, joined with ", "
  resource NAME                the worker's device resource (requests = limits)
  nodeSelector KEY             the worker pods' node selector
  profile                      the file the Ray worker container sources before `ray start` (fabric.ncclEnvProfile)
  check                        the fabric the training entrypoint checks (--fabric-check)
  image tag                    the training image's tag the RayJob runs
  image-arg KEY                a build argument of docker/efa.args (the EFA image variant)
  image-env NAME               the ENV line of docker/Dockerfile's runtime stage, as written
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from conftest import ROOT
from docker_stack import read_args_file
from k8s_support import VALUES_DIR, helm_objects, user_values

FABRIC = ROOT / "docs" / "fabric.md"
EFA_ARGS = ROOT / "docker" / "efa.args"
CLOUDS = ("eks-p5", "gke-a3-mega", "gke-a3-high", "gke-a3-ultra")
HEADER = ["setting", "value", "source (version, date)", "must / recommended", "deviation and why"]
UNSET = "(unset)"


def vendor_tables() -> dict[str, list[dict[str, str]]]:
    """cloud -> its table rows, from the first table after each heading that names `values/<cloud>.yaml`."""
    tables: dict[str, list[dict[str, str]]] = {}
    cloud, rows, header = None, None, None
    for line in FABRIC.read_text().splitlines():
        if line.startswith("#"):
            m = re.search(r"`values/([a-z0-9-]+)\.yaml`", line)
            cloud = m.group(1) if m else None
            rows, header = None, None
            continue
        if cloud and line.startswith("|") and cloud not in tables or rows is not None:
            if not line.startswith("|"):
                tables[cloud], cloud, rows = rows, None, None
                continue
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if header is None:
                header, rows = cells, []
                assert header == HEADER, f"docs/fabric.md, table of {cloud}: columns {header}, expected {HEADER}"
            elif not set(line) <= set("|-: "):
                rows.append(dict(zip(header, cells)))
    if cloud and rows:
        tables[cloud] = rows
    return tables


def _code(cell: str) -> str:
    m = re.fullmatch(r"`([^`]*)`", cell.strip())
    assert m, f"docs/fabric.md vendor table: {cell!r} must be one `code` span"
    return m.group(1).replace("\\|", "|")


def _text(value) -> str:
    if value is None:
        return UNSET
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ", ".join(_text(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return " ".join(str(value).split())


def _field(obj, path: str):
    for part in path.split("."):
        if obj is None:
            return None
        obj = obj[int(part)] if isinstance(obj, list) else obj.get(part)
    return obj


class Rendered:
    """The two-node check of one cloud file as rendered as Helm renders it."""

    def __init__(self, cloud: str):
        files = [VALUES_DIR / f for f in ("smoke.yaml", "smoke-2node.yaml", f"{cloud}.yaml")]
        objects = helm_objects(user_values(files), release="dapo-smoke", namespace="ml")
        self.rayjob = next(o for o in objects if o["kind"] == "RayJob")
        cluster = self.rayjob["spec"]["rayClusterSpec"]
        self.head = cluster["headGroupSpec"]["template"]
        self.worker = cluster["workerGroupSpecs"][0]["template"]
        spec = self.worker["spec"]
        self.containers = {c["name"]: c for c in spec.get("initContainers", []) + spec["containers"]}
        self.ray = self.containers["ray-worker"]

    def env(self, name: str) -> str:
        values = set()
        for tpl in (self.head, self.worker):
            ray = tpl["spec"]["containers"][0]
            values.add(next((e.get("value") for e in ray.get("env", []) if e["name"] == name), None))
        assert len(values) == 1, f"{name}: head and workers differ: {values}"
        return _text(values.pop())

    def resolve(self, setting: str) -> str:
        kind, _, rest = setting.partition(" ")
        spec, annotations = self.worker["spec"], self.worker["metadata"].get("annotations") or {}
        if kind == "env":
            return self.env(rest)
        if kind == "container":
            name, _, path = rest.partition(" ")
            if path.startswith("env "):
                env = self.containers[name].get("env", [])
                return _text(next((e.get("value") for e in env if e["name"] == path[4:]), None))
            return _text(_field(self.containers.get(name), path))
        if kind == "mount":
            name, _, volume = rest.partition(" ")
            m = next((m for m in self.containers[name].get("volumeMounts", []) if m["name"] == volume), None)
            return UNSET if m is None else m["mountPath"] + (" (read-only)" if m.get("readOnly") else "")
        if kind == "volume":
            vol = next((v for v in spec["volumes"] if v["name"] == rest), None)
            if vol is None:
                return UNSET
            return f"hostPath {vol['hostPath']['path']}" if "hostPath" in vol else next(k for k in vol if k != "name")
        if kind == "annotation":
            return _text(annotations.get(rest))
        if kind == "interfaces":
            return " ".join(f"{i['interfaceName']}={i['network']}"
                            for i in json.loads(annotations["networking.gke.io/interfaces"]))
        if kind == "devices":
            text = annotations.get(f"devices.gke.io/container.{rest}")
            return UNSET if text is None else ", ".join(d["path"] for d in yaml.safe_load(text))
        if kind == "resource":
            res = self.ray["resources"]
            assert res["requests"].get(rest) == res["limits"].get(rest), rest
            return _text(res["limits"].get(rest))
        if kind == "nodeSelector":
            return _text((spec.get("nodeSelector") or {}).get(rest))
        if kind == "profile":
            args = self.ray.get("args") or []
            m = re.match(r'if \[ -r "([^"]+)" \]; then \. "\1";', args[0]) if args else None
            return m.group(1) if m else UNSET
        if kind == "check":
            m = re.search(r"--fabric-check=(\S+)", self.rayjob["spec"]["entrypoint"])
            return m.group(1) if m else UNSET
        if setting == "image tag":
            return self.ray["image"].rsplit(":", 1)[1]
        if kind == "image-arg":
            return read_args_file(EFA_ARGS).get(rest, UNSET)
        if kind == "image-env":
            env = re.findall(rf"^ENV {re.escape(rest)}=(\S+)\s*$", (ROOT / "docker" / "Dockerfile").read_text(), re.M)
            return env[-1] if env else UNSET
        raise AssertionError(f"docs/fabric.md vendor table: unknown setting {setting!r} (tests/test_vendor_tables.py)")


TABLES = vendor_tables()


def test_every_cloud_file_has_its_vendor_table():
    assert set(CLOUDS) <= set(TABLES), f"docs/fabric.md: no vendor table for {sorted(set(CLOUDS) - set(TABLES))}"


@pytest.mark.parametrize("cloud", CLOUDS)
def test_every_row_of_the_vendor_table_is_what_the_chart_renders(cloud):
    rendered = Rendered(cloud)
    rows = TABLES[cloud]
    assert len(rows) >= 8, f"{cloud}: {len(rows)} rows"
    drift = []
    for row in rows:
        setting, want = _code(row["setting"]), _code(row["value"])
        assert re.search(r"20\d\d", row["source (version, date)"]), f"{cloud} {setting}: the source names no date"
        assert row["must / recommended"].split(":")[0].strip(" *") in ("must", "recommended", "ours"), (cloud, setting)
        got = rendered.resolve(setting)
        if got != want:
            drift.append(f"{setting}: table {want!r}, rendered {got!r}")
    assert not drift, f"values/{cloud}.yaml drifted from its table in docs/fabric.md:\n" + "\n".join(drift)


@pytest.mark.parametrize("cloud", CLOUDS)
def test_every_setting_of_the_cloud_file_has_a_row(cloud):
    """No setting of the cloud file escapes the table: its variables, annotations, volumes, devices, node selector,
    sidecar images and profile each have a row."""
    values = yaml.safe_load((VALUES_DIR / f"{cloud}.yaml").read_text())
    settings = {_code(r["setting"]) for r in TABLES[cloud]}
    worker = values.get("worker") or {}
    want = {f"env {k}" for k in values.get("nccl") or {}}
    want |= {f"annotation {k}" for k in worker.get("annotations") or {}
             if not k.startswith("devices.gke.io/") and k != "networking.gke.io/interfaces"}
    want |= {f"devices {k.removeprefix('devices.gke.io/container.')}" for k in worker.get("annotations") or {}
             if k.startswith("devices.gke.io/")}
    want |= {"interfaces"} if "networking.gke.io/interfaces" in (worker.get("annotations") or {}) else set()
    want |= {f"volume {v['name']}" for v in worker.get("extraVolumes") or []}
    want |= {f"mount ray-worker {m['name']}" for m in worker.get("extraVolumeMounts") or []}
    want |= {f"resource {k}" for k in worker.get("extraResources") or {}}
    want |= {f"nodeSelector {k}" for k in worker.get("nodeSelector") or {}}
    for c in worker.get("sidecarContainers") or []:
        want |= {f"container {c['name']} image"} | {f"mount {c['name']} {m['name']}" for m in c.get("volumeMounts", [])}
        want |= {f"container {c['name']} env {e['name']}" for e in c.get("env", [])}
    want |= {"profile"} if (values.get("fabric") or {}).get("ncclEnvProfile") else set()
    want |= {"check"}
    missing = sorted(want - settings)
    assert not missing, f"values/{cloud}.yaml: settings without a row in its docs/fabric.md table: {missing}"


def test_a_drifted_value_is_caught(monkeypatch):
    """The comparison can fail: a table row that disagrees with the rendered value is reported."""
    cloud = "gke-a3-mega"
    rendered = Rendered(cloud)
    row = next(r for r in TABLES[cloud] if _code(r["setting"]).startswith("container "))
    assert rendered.resolve(_code(row["setting"])) == _code(row["value"])
    rendered.containers = {k: {**c, "image": "example.com/other:1.0.0"} for k, c in rendered.containers.items()}
    assert rendered.resolve(f"container {_code(row['setting']).split()[1]} image") == "example.com/other:1.0.0"
