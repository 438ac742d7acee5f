"""What a schema cannot see in deploy/: that the pieces fit together.

For each form under deploy/kubernetes/ (a folder with a kustomization.yaml other than base/):
every resource a kustomization.yaml lists exists; each workload's selector matches its pod
labels; each *_FILE variable names a file of the mounted Secret, and that key is in the
Secret; each probe names a container port; the Service, the ServiceMonitor and the
PodDisruptionBudget select the relay's pods and ports; a form runs one source (table or wal),
and a WAL Deployment has a standby. The image's user (deploy/Dockerfile USER) is the pods'
runAsUser, and its EXPOSEd port the containers' admin port. Every variable the systemd env
file names is documented in docs/configuration.md.

    python consistency.py ROOT      # exits 1 with one line per problem
"""

import pathlib
import re
import sys

import yaml

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
kube = root / "deploy" / "kubernetes"
problems = []


def problem(where, text):
    problems.append(f"{where}: {text}")


def resources(folder, seen=None):
    """(path, document) of every resource the kustomization in `folder` includes."""
    seen = set() if seen is None else seen
    kfile = folder / "kustomization.yaml"
    k = yaml.safe_load(kfile.read_text())
    out = []
    for entry in k.get("resources", []):
        path = (folder / entry).resolve()
        if path.is_dir():
            if not (path / "kustomization.yaml").exists():
                problem(kfile.relative_to(root), f"{entry} is a folder without kustomization.yaml")
                continue
            out += resources(path, seen)
        elif path.is_file():
            if path not in seen:
                seen.add(path)
                out += [(path, d) for d in yaml.safe_load_all(path.read_text()) if d]
        else:
            problem(kfile.relative_to(root), f"{entry} does not exist")
    return out


def matches(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def pod_spec(doc):
    kind = doc["kind"]
    if kind in ("Deployment", "Job"):
        return doc["spec"]["template"]
    if kind == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]
    return None


dockerfile = (root / "deploy" / "Dockerfile").read_text()
image_user = re.search(r"^USER (\d+)", dockerfile, re.M)
image_port = re.search(r"^EXPOSE (\d+)", dockerfile, re.M)

forms = [p for p in sorted(kube.iterdir()) if (p / "kustomization.yaml").exists() and p.name != "base"]
if not forms:
    problem(kube, "no form (a folder with kustomization.yaml) found")
for form in forms:
    docs = resources(form)
    where = lambda path, doc: f"{path.relative_to(root)} ({doc['kind']} {doc['metadata']['name']})"
    secrets = {d["metadata"]["name"]: d for _, d in docs if d["kind"] == "Secret"}
    pods = []  # the long-running relays' (labels, ports by name, where)
    sources = set()
    for path, doc in docs:
        template = pod_spec(doc)
        if template is None:
            continue
        w = where(path, doc)
        labels = template["metadata"].get("labels", {})
        spec = template["spec"]
        if doc["kind"] == "Deployment" and not matches(doc["spec"]["selector"]["matchLabels"], labels):
            problem(w, "the selector does not match the pod template's labels")
        if image_user and spec.get("securityContext", {}).get("runAsUser") != int(image_user[1]):
            problem(w, f"runAsUser is not the image's user {image_user[1]}")
        mounts_of = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec["containers"]:
            if c["image"].split(":")[0] != "txoutbox":
                problem(w, f"image {c['image']}: name it `txoutbox` so the kustomizations' `images:` set it")
            ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            if "admin" in ports and image_port and ports["admin"] != int(image_port[1]):
                problem(w, f"admin port {ports['admin']} is not the image's EXPOSE {image_port[1]}")
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                if port is not None and port not in ports and port not in ports.values():
                    problem(w, f"{probe} port {port} is not a container port")
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            args = c.get("args", [])
            if args[:1] == ["relay"] and "--drain" not in args:
                source = env.get("TXOUTBOX_SOURCE", "table")
                sources.add(source)
                pods.append((labels, ports, w))
                if source == "wal" and doc["spec"].get("replicas", 1) < 2:
                    problem(w, "a WAL relay without a standby: replicas must be 2 or more")
            for name, value in env.items():
                if not name.endswith("_FILE"):
                    continue
                mount = next((m for m in c.get("volumeMounts", []) if value.startswith(m["mountPath"].rstrip("/") + "/")), None)
                if mount is None:
                    problem(w, f"{name}={value} is under no volume mount")
                    continue
                volume = mounts_of.get(mount["name"], {})
                secret = volume.get("secret", {}).get("secretName")
                key = value[len(mount["mountPath"].rstrip("/")) + 1:]
                if secret is None:
                    problem(w, f"{name}: {mount['name']} is not a Secret volume")
                elif secret not in secrets:
                    problem(w, f"{name}: Secret {secret} is not in the form")
                elif key not in {**secrets[secret].get("stringData", {}), **secrets[secret].get("data", {})}:
                    problem(w, f"{name}: Secret {secret} has no key {key}")
    if len(sources) > 1:
        problem(form, f"runs relays of {sorted(sources)}: one source per table")
    for path, doc in docs:
        w = where(path, doc)
        if doc["kind"] == "Service":
            selected = [p for p in pods if matches(doc["spec"]["selector"], p[0])]
            if pods and not selected:
                problem(w, "selects no relay pod")
            for sp in doc["spec"]["ports"]:
                for p in selected:
                    if sp["targetPort"] not in p[1] and sp["targetPort"] not in p[1].values():
                        problem(w, f"targetPort {sp['targetPort']} is not a port of {p[2]}")
        if doc["kind"] == "ServiceMonitor":
            services = [d for _, d in docs if d["kind"] == "Service" and matches(doc["spec"]["selector"]["matchLabels"], d["metadata"].get("labels", {}))]
            if not services:
                problem(w, "selects no Service")
            for e in doc["spec"]["endpoints"]:
                for s in services:
                    if e["port"] not in [p["name"] for p in s["spec"]["ports"]]:
                        problem(w, f"endpoint port {e['port']} is not a port of Service {s['metadata']['name']}")
        if doc["kind"] == "PodDisruptionBudget":
            if not any(matches(doc["spec"]["selector"]["matchLabels"], p[0]) for p in pods):
                problem(w, "selects no relay pod")

env_file = root / "deploy" / "systemd" / "txoutbox.env"
documented = (root / "docs" / "configuration.md").read_text()
for n, line in enumerate(env_file.read_text().splitlines(), 1):
    m = re.match(r"^#?([A-Z][A-Z0-9_]*)=", line)
    if m and f"`{m[1]}`" not in documented:
        problem(f"{env_file.relative_to(root)}:{n}", f"{m[1]} is not in docs/configuration.md")

for p in problems:
    print(p)
print(f"consistency: {len(forms)} forms, {len(problems)} problem(s)")
sys.exit(1 if problems else 0)
