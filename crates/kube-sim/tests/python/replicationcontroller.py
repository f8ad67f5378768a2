"""ReplicationControllers through the Python client: they keep their pods as ReplicaSets do
(scale up and down through the scale subresource, a deleted pod replaced) and report counts."""
import sys

from kubernetes import client, config

from helpers import eventually

config.load_kube_config(config_file=sys.argv[1])
core = client.CoreV1Api()


def live_pods():
    pods = core.list_namespaced_pod("default", label_selector="app=legacy").items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def settled(n):
    def check():
        rc = core.read_namespaced_replication_controller_status("legacy", "default")
        pods = live_pods()
        ok = (len(pods) == n and (rc.status.replicas or 0) == n
              and (rc.status.ready_replicas or 0) == n
              and all(p.status.phase == "Running" for p in pods))
        return ok
    return check


rc = {"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "legacy"},
      "spec": {"replicas": 2,
               "template": {"metadata": {"labels": {"app": "legacy"}},
                            "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}}
created = core.create_namespaced_replication_controller("default", rc)
# No selector given: the template's labels are the selector and the RC's labels.
assert created.spec.selector == {"app": "legacy"}, created.spec.selector
assert created.metadata.labels == {"app": "legacy"}, created.metadata.labels

eventually("2 pods", settled(2))
for p in live_pods():
    owner = p.metadata.owner_references[0]
    assert (owner.api_version, owner.kind, owner.name, owner.controller) == \
        ("v1", "ReplicationController", "legacy", True), owner

core.patch_namespaced_replication_controller_scale("legacy", "default", {"spec": {"replicas": 4}})
eventually("4 pods", settled(4))
scale = core.read_namespaced_replication_controller_scale("legacy", "default")
assert scale.spec.replicas == 4 and scale.status.replicas == 4, scale

core.patch_namespaced_replication_controller("legacy", "default", {"spec": {"replicas": 1}})
eventually("1 pod", settled(1))

victim = live_pods()[0]
core.delete_namespaced_pod(victim.metadata.name, "default")
eventually("a replacement", lambda: [p.metadata.uid for p in live_pods()] not in ([], [victim.metadata.uid]))
eventually("1 pod again", settled(1))
assert live_pods()[0].metadata.uid != victim.metadata.uid
print("ok")
