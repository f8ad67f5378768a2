"""pods/portforward through the Python client's `portforward` (the v4.channel.k8s.io WebSocket
protocol) against a kube-sim pod serving HTTP on 8080; nothing listens on 8081."""
import sys
import time

from kubernetes import client, config
from kubernetes.stream import portforward

config.load_kube_config(config_file=sys.argv[1])
api = client.CoreV1Api()

pf = portforward(api.connect_get_namespaced_pod_portforward, "web", "default", ports="8080,8081")
sock = pf.socket(8080)
sock.setblocking(True)
sock.sendall(b"GET /through-the-tunnel HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n")
reply = b""
while True:
    chunk = sock.recv(4096)
    if not chunk:
        break
    reply += chunk
sock.close()
assert reply.startswith(b"HTTP/1.1 200"), reply
assert reply.endswith(b"hello from web"), reply

deadline = time.time() + 10
while pf.error(8081) is None and time.time() < deadline:
    time.sleep(0.05)
error = pf.error(8081)
assert error is not None and "error forwarding port 8081 to pod web" in error, error
assert "connection refused" in error.lower(), error
pf.close()
print("ok")
