"""DaemonSets through the Python client: a pod per eligible Node (nodeSelector, untolerated
NoSchedule taints kept off, cordoned nodes keep their daemon), the status counts, a rolling
update on template change and a deleted daemon pod replaced."""
import sys

from kubernetes import client, config

from helpers import eventually

config.load_kube_config(config_file=sys.argv[1])
core = client.CoreV1Api()
apps = client.AppsV1Api()


def node(name, labels, taints=None):
    core.create_node(client.V1Node(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1NodeSpec(taints=taints)))


node("n1", {"role": "worker"})
node("n2", {"role": "worker"})
node("n3", {})
node("gpu", {"role": "worker"}, [client.V1Taint(key="dedicated", value="gpu", effect="NoSchedule")])

ds = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent"},
      "spec": {"selector": {"matchLabels": {"app": "agent"}},
               "template": {"metadata": {"labels": {"app": "agent"}},
                            "spec": {"nodeSelector": {"role": "worker"},
                                     "containers": [{"name": "a", "image": "agent:1"}]}}}}
apps.create_namespaced_daemon_set("default", ds)


def daemon_pods():
    pods = core.list_namespaced_pod("default", label_selector="app=agent").items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def nodes_of(pods):
    return sorted(p.spec.node_name for p in pods)


def status_is(**want):
    def check():
        s = apps.read_namespaced_daemon_set_status("agent", "default").status
        got = {k: getattr(s, k) for k in want}
        return got == want or None
    return check


eventually("two daemons ready", status_is(desired_number_scheduled=2, current_number_scheduled=2,
                                          number_ready=2, updated_number_scheduled=2,
                                          number_misscheduled=0, observed_generation=1))
pods = daemon_pods()
assert nodes_of(pods) == ["n1", "n2"], nodes_of(pods)
for p in pods:
    assert p.metadata.owner_references[0].kind == "DaemonSet", p.metadata.owner_references
    assert p.metadata.owner_references[0].controller is True
    keys = [t.key for t in p.spec.tolerations]
    assert "node.kubernetes.io/unschedulable" in keys, keys
    assert p.status.phase == "Running", p.status.phase

# Cordoned: the daemon stays. A newly labelled node gets one.
core.patch_node("n2", {"spec": {"unschedulable": True}})
core.patch_node("n3", {"metadata": {"labels": {"role": "worker"}}})
eventually("a daemon on n3", lambda: nodes_of(daemon_pods()) == ["n1", "n2", "n3"])
eventually("three ready", status_is(desired_number_scheduled=3, number_ready=3))

# A node that stops matching loses its daemon.
core.patch_node("n3", {"metadata": {"labels": {"role": None}}})
eventually("no daemon on n3", lambda: nodes_of(daemon_pods()) == ["n1", "n2"])

# Template change: a rolling update replaces every daemon.
apps.patch_namespaced_daemon_set("agent", "default",
                                 {"spec": {"template": {"spec": {"containers": [{"name": "a", "image": "agent:2"}]}}}})
eventually("rolled out", status_is(desired_number_scheduled=2, updated_number_scheduled=2,
                                   number_ready=2, observed_generation=2))
eventually("new image everywhere",
           lambda: sorted(p.spec.containers[0].image for p in daemon_pods()) == ["agent:2", "agent:2"])

# A deleted daemon pod is replaced on its node.
victim = [p for p in daemon_pods() if p.spec.node_name == "n1"][0]
core.delete_namespaced_pod(victim.metadata.name, "default")
eventually("replaced on n1", lambda: any(p.spec.node_name == "n1" and p.metadata.uid != victim.metadata.uid
                                         for p in daemon_pods()))
print("ok")
