"""Jobs through the Python client, with simulated pods (they succeed one pass after running):
completions and parallelism honoured, the status counts and the 1.33 conditions."""
import sys
import time

from kubernetes import client, config

config.load_kube_config(config_file=sys.argv[1])
batch = client.BatchV1Api()
core = client.CoreV1Api()

job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "batch-of-3"},
       "spec": {"completions": 3, "parallelism": 2,
                "template": {"spec": {"restartPolicy": "Never",
                                      "containers": [{"name": "w", "image": "worker:1"}]}}}}
created = batch.create_namespaced_job("default", job)
assert created.spec.backoff_limit == 6, created.spec.backoff_limit
assert created.spec.completion_mode == "NonIndexed"
uid = created.metadata.uid
assert created.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": uid}, created.spec.selector
assert created.spec.template.metadata.labels["job-name"] == "batch-of-3"

deadline = time.time() + 30
while time.time() < deadline:
    j = batch.read_namespaced_job_status("batch-of-3", "default")
    types = [c.type for c in (j.status.conditions or []) if c.status == "True"]
    if "Complete" in types:
        break
    # Never more than `parallelism` at once.
    assert (j.status.active or 0) <= 2, j.status
    time.sleep(0.1)
else:
    raise AssertionError("job never completed: %r" % j.status)

assert types == ["SuccessCriteriaMet", "Complete"], types
complete = [c for c in j.status.conditions if c.type == "Complete"][0]
assert complete.reason == "CompletionsReached", complete
assert j.status.succeeded == 3, j.status
assert not j.status.failed and not j.status.active, j.status
assert j.status.completion_time is not None and j.status.start_time is not None

pods = core.list_namespaced_pod("default", label_selector="batch.kubernetes.io/job-name=batch-of-3").items
assert len(pods) == 3, [p.metadata.name for p in pods]
for p in pods:
    assert p.status.phase == "Succeeded", p.status.phase
    assert p.status.container_statuses[0].state.terminated.exit_code == 0
print("ok")
