"""pods/exec through the Python client's WebSocket `stream` API against a kube-sim pod."""
import sys

from kubernetes import client, config
from kubernetes.stream import stream

config.load_kube_config(config_file=sys.argv[1])
api = client.CoreV1Api()

out = stream(api.connect_get_namespaced_pod_exec, "web-2", "default",
             command=["sh", "-c", "echo $POD_NAME; echo oops >&2"],
             stderr=True, stdin=False, stdout=True, tty=False)
assert "web-2" in out, out

# Channels and the exit code, with stdin.
resp = stream(api.connect_get_namespaced_pod_exec, "web-2", "default",
              command=["sh", "-c", "read line; echo got-$line; exit 5"],
              stderr=True, stdin=True, stdout=True, tty=False, _preload_content=False)
resp.write_stdin("hello\n")
stdout = ""
while resp.is_open():
    resp.update(timeout=5)
    stdout += resp.read_stdout()
resp.close()
assert stdout == "got-hello\n", repr(stdout)
assert resp.returncode == 5, resp.returncode
print("ok")
