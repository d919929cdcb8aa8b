"""docker/k8s: schema-valid for pinned Kubernetes versions, and consistent with
each other, the image and the engine's configuration."""
import json

import kubernetes_validate
import pytest
import yaml

from engine_lib.config import EncoderConfig, PairTokenizerConfig, TokenizerConfig
from rose_triton.parameters import env_overrides
from testing import REPO
from testing.dockerfile import image_env, instructions

K8S = REPO / "docker" / "k8s"
KUBERNETES_VERSIONS = ["1.30.0", "1.37.0"]  # oldest we support, newest kubernetes-validate knows
MANIFESTS = sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


def load(name):
    (doc,) = yaml.safe_load_all((K8S / name).read_text())
    return doc


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(K8S)))
def test_manifest_is_valid(path, version):
    for doc in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_rejects_a_broken_manifest():
    deployment = load("deployment.yaml")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["periodSecond"] = 5
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)


def test_kustomization_lists_every_manifest_of_the_app():
    kustomization = load("kustomization.yaml")
    assert sorted(kustomization["resources"]) == sorted(p.name for p in K8S.glob("*.yaml")
                                                        if p.name != "kustomization.yaml")
    assert kustomization["images"][0]["name"] == container()["image"].split(":")[0]


def container():
    return load("deployment.yaml")["spec"]["template"]["spec"]["containers"][0]


def test_selectors_ports_and_probes_line_up():
    deployment = load("deployment.yaml")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    for name in ("service.yaml", "service-headless.yaml"):
        service = load(name)
        assert service["spec"]["selector"].items() <= pod_labels.items()
        named_ports = {p["name"]: p["containerPort"] for p in container()["ports"]}
        for port in service["spec"]["ports"]:
            assert named_ports[port["targetPort"]] == port["port"]
    assert {p["name"]: p["port"] for p in load("service.yaml")["spec"]["ports"]} == {
        "http": 8000, "grpc": 8001, "metrics": 8002}
    assert load("service-headless.yaml")["spec"]["clusterIP"] == "None"
    assert load("pdb.yaml")["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    probes = {kind: container()[kind]["httpGet"]["path"] for kind in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert probes == {"startupProbe": "/v2/health/ready", "readinessProbe": "/v2/health/ready",
                      "livenessProbe": "/v2/health/live"}
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == 8002 and annotations["prometheus.io/scrape"] == "true"


def test_pod_matches_the_image():
    pod = load("deployment.yaml")["spec"]["template"]["spec"]
    user = [args for kw, args in instructions() if kw == "USER"][-1]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == int(user)
    assert container()["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "args" not in container() and "command" not in container()  # the image's launcher runs


def test_draining_fits_the_grace_period():
    pod = load("deployment.yaml")["spec"]["template"]["spec"]
    pre_stop = container()["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    command = json.loads([args for kw, args in instructions() if kw == "CMD"][0])
    (exit_timeout,) = [int(a.split("=")[1]) for a in command if a.startswith("--exit-timeout-secs=")]
    assert int(pre_stop[1]) + exit_timeout < pod["terminationGracePeriodSeconds"]


def test_autoscaler_reads_the_metric_the_adapter_serves():
    hpa = load("hpa.yaml")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "rose-embed"}
    assert hpa["spec"]["minReplicas"] >= 2  # with the PDB, a voluntary disruption keeps one replica serving
    rules = yaml.safe_load(load("monitoring/prometheus-adapter-rules.yaml")["data"]["config.yaml"])["rules"]
    served = {rule["name"]["as"] for rule in rules}
    assert {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]} <= served


def test_configmap_settings_reach_the_engine_configuration():
    settings = load("configmap.yaml")["data"]
    fields = {f"ROSE_{name.upper()}" for cls in (EncoderConfig, TokenizerConfig) for name in cls.__dataclass_fields__}
    fields |= {f"ROSE_RERANK_{name.upper()}" for cls in (EncoderConfig, PairTokenizerConfig)
               for name in cls.__dataclass_fields__}
    assert set(settings) <= fields
    assert env_overrides(EncoderConfig, settings, prefix="ROSE_RERANK_") == {}  # no reranker by default
    encoder = EncoderConfig.from_parameters({}, **env_overrides(EncoderConfig, settings))
    assert encoder.max_batch_tokens == int(settings["ROSE_MAX_BATCH_TOKENS"])
    assert encoder.model_dir == settings["ROSE_MODEL_DIR"]
    TokenizerConfig.from_parameters({}, **env_overrides(TokenizerConfig, settings))
    with pytest.raises(ValueError, match="max_batch_tokens"):
        EncoderConfig.from_parameters({}, **env_overrides(EncoderConfig, {"ROSE_MAX_BATCH_TOKENS": "lots"}))
    assert env_overrides(EncoderConfig, {"ROSE_MODEL_DIR": ""}) == {}  # empty = keep config.pbtxt's
    assert image_env()["ROSE_SKIP_SETUP"] == "1" and "ROSE_SKIP_SETUP" not in settings


def test_gateway_role_runs_the_same_image_against_the_headless_service(monkeypatch, tmp_path):
    from gateway.config import parse_args

    pod = load("gateway-deployment.yaml")["spec"]["template"]
    (gateway,) = pod["spec"]["containers"]
    assert gateway["image"] == container()["image"]
    assert gateway["command"][:3] == ["python3", "-m", "gateway"]
    # on 0.0.0.0 it needs its keys, which come from a Secret mounted as a file
    monkeypatch.delenv("ROSE_GATEWAY_API_KEYS", raising=False)
    monkeypatch.delenv("ROSE_GATEWAY_API_KEY_FILE", raising=False)
    monkeypatch.delenv("ROSE_GATEWAY_ALLOW_UNAUTHENTICATED", raising=False)
    with pytest.raises(ValueError, match="no API key is set"):
        parse_args(gateway["command"][3:])
    assert "ROSE_GATEWAY_API_KEY_FILE" in {e["name"] for e in gateway["env"]}
    (tmp_path / "api-keys").write_text("from-the-secret\n")
    monkeypatch.setenv("ROSE_GATEWAY_API_KEY_FILE", str(tmp_path / "api-keys"))
    config = parse_args(gateway["command"][3:])
    assert config.api_keys == {"from-the-secret"}
    headless = load("service-headless.yaml")
    grpc_port = {p["name"]: p["port"] for p in headless["spec"]["ports"]}["grpc"]
    assert config.triton == (f"dns:///{headless['metadata']['name']}:{grpc_port}",)
    assert config.host == "0.0.0.0" and gateway["ports"][0]["containerPort"] == config.port
    assert gateway["envFrom"] == container()["envFrom"]  # the same model folder as the tokenizer
    assert "nvidia.com/gpu" not in gateway["resources"].get("limits", {})
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/health"
    # the Triton pods run Triton only, and their Services never select gateway pods
    assert {"name": "ROSE_GATEWAY", "value": "0"} in container()["env"]
    for name in ("service.yaml", "service-headless.yaml", "pdb.yaml"):
        spec = load(name)["spec"]
        selector = spec.get("selector", {}).get("matchLabels") or spec["selector"]
        assert not selector.items() <= pod["metadata"]["labels"].items()
    service = load("gateway-service.yaml")["spec"]
    assert service["selector"].items() <= pod["metadata"]["labels"].items()
    assert service["ports"][0]["port"] == config.port and service["ports"][0]["targetPort"] == "http"
    hpa = load("gateway-hpa.yaml")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "rose-gateway"}
    assert hpa["metrics"][0]["resource"]["name"] == "cpu" and gateway["resources"]["requests"]["cpu"]


def gateway_container():
    (gateway,) = load("gateway-deployment.yaml")["spec"]["template"]["spec"]["containers"]
    return gateway


def test_network_policy_lets_only_the_gateway_reach_triton_and_only_monitoring_its_metrics():
    policy = load("networkpolicy.yaml")["spec"]
    triton_labels = load("deployment.yaml")["spec"]["template"]["metadata"]["labels"]
    gateway_labels = load("gateway-deployment.yaml")["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= triton_labels.items()
    assert not policy["podSelector"]["matchLabels"].items() <= gateway_labels.items()
    assert policy["policyTypes"] == ["Ingress"]
    ports = {p["name"]: p["containerPort"] for p in container()["ports"]}
    admitted = {}  # container port -> the sources allowed to reach it
    for rule in policy["ingress"]:
        (source,) = rule["from"]  # an empty `from` would admit everyone
        assert rule["ports"] and all(p["protocol"] == "TCP" for p in rule["ports"])
        for port in rule["ports"]:
            admitted.setdefault(port["port"], []).append(source)
    gateway = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": gateway_labels["app.kubernetes.io/name"]}}}
    monitoring_namespace = load("monitoring/prometheus-adapter-rules.yaml")["metadata"]["namespace"]
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": monitoring_namespace}}}
    assert admitted == {ports["http"]: [gateway], ports["grpc"]: [gateway], ports["metrics"]: [monitoring]}
    assert gateway["podSelector"]["matchLabels"].items() <= gateway_labels.items()


def test_gateway_reads_its_api_keys_from_a_secret_it_cannot_start_without():
    pod = load("gateway-deployment.yaml")["spec"]["template"]["spec"]
    env = {e["name"]: e for e in gateway_container()["env"]}
    key_file = env["ROSE_GATEWAY_API_KEY_FILE"]["value"]
    (mount,) = [m for m in gateway_container()["volumeMounts"] if key_file.startswith(m["mountPath"] + "/")]
    assert mount["readOnly"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    secret = volume["secret"]
    assert secret["secretName"] == "rose-gateway-api-keys" and not secret.get("optional", False)
    assert [item["path"] for item in secret["items"]] == [key_file[len(mount["mountPath"]) + 1:]]
    assert secret["defaultMode"] & 0o007 == 0  # not readable by other users
    assert "ROSE_GATEWAY_API_KEYS" not in env  # no key in the manifest itself


def test_gateway_probes_use_its_liveness_and_readiness_routes():
    from gateway.engine.liveness import LIVENESS_PATH

    gateway = gateway_container()
    assert gateway["livenessProbe"]["httpGet"] == {"path": LIVENESS_PATH, "port": "http"}
    assert "tcpSocket" not in gateway["livenessProbe"]
    assert gateway["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}


def test_gateway_drains_within_its_grace_period(monkeypatch):
    from gateway.config import parse_args

    pod = load("gateway-deployment.yaml")["spec"]["template"]["spec"]
    pre_stop = gateway_container()["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    monkeypatch.delenv("ROSE_GATEWAY_API_KEY_FILE", raising=False)
    monkeypatch.setenv("ROSE_GATEWAY_API_KEYS", "from-the-secret")  # on 0.0.0.0 it starts only with keys
    config = parse_args(gateway_container()["command"][3:])
    assert int(pre_stop[1]) + config.request_timeout_s < pod["terminationGracePeriodSeconds"]


def test_both_roles_read_one_models_file_from_a_configmap(monkeypatch, tmp_path):
    """The Triton pods (serve.sh) and the gateway pods read ROSE_MODELS_FILE from the same
    ConfigMap key; the shipped file serves nothing by name, and its commented example reads."""
    from gateway.config import parse_args
    from rose_triton.models_file import check_models, model_configs, read_models_file

    configmap = load("models-configmap.yaml")
    paths = set()
    for name in ("deployment.yaml", "gateway-deployment.yaml"):
        pod = load(name)["spec"]["template"]["spec"]
        (container_,) = pod["containers"]
        path = {e["name"]: e.get("value") for e in container_["env"]}["ROSE_MODELS_FILE"]
        (mount,) = [m for m in container_["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert mount["readOnly"] and volume["configMap"]["name"] == configmap["metadata"]["name"]
        assert path[len(mount["mountPath"]) + 1:] in configmap["data"]
        paths.add(path)
    (path,) = paths
    text = configmap["data"][path.rsplit("/", 1)[1]]
    (tmp_path / "models.yaml").write_text(text)
    assert read_models_file(str(tmp_path / "models.yaml")) == []
    example = "\n".join(line.replace("# ", "", 1) for line in text.split("# For example:\n", 1)[1].splitlines())
    (tmp_path / "example.yaml").write_text(example)
    models = read_models_file(str(tmp_path / "example.yaml"))
    assert [m.name for m in models] == ["bge-m3", "bge-reranker"]
    check_models(models)
    for model in models:
        model_configs(model, {})
    monkeypatch.setenv("ROSE_MODELS_FILE", path)
    monkeypatch.setenv("ROSE_GATEWAY_API_KEYS", "from-the-secret")
    assert parse_args(gateway_container()["command"][3:]).models_file == path


def test_gateway_keeps_batch_jobs_on_a_claim_its_pods_share():
    pod = load("gateway-deployment.yaml")["spec"]["template"]["spec"]
    (gateway,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in gateway["env"]}
    mounts = {m["name"]: m["mountPath"] for m in gateway["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["data"] == env["ROSE_GATEWAY_DATA_DIR"]
    claim = load("gateway-data-pvc.yaml")
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    if claim["spec"]["accessModes"] == ["ReadWriteOnce"]:  # one node's: the pods go to one node
        (term,) = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert term["labelSelector"]["matchLabels"].items() <= pod_labels("gateway-deployment.yaml").items()


def pod_labels(name):
    return load(name)["spec"]["template"]["metadata"]["labels"]
