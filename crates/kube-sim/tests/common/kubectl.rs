//! The real kubectl against a started kube-sim, with its own kubeconfig, HOME and cache dir.
//! A missing kubectl fails the test (it is on the machine image).

use std::path::PathBuf;
use std::process::Stdio;

pub struct Kubectl {
    kubeconfig: PathBuf,
    dir: tempfile::TempDir,
}

pub struct Out {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Kubectl {
    pub fn new(sim: &kube_sim::KubeSim) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        sim.write_kubeconfig(&kubeconfig)
            .expect("kubeconfig written");
        Self { kubeconfig, dir }
    }

    pub fn file(&self, name: &str, content: &str) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, content).expect("write manifest");
        p.display().to_string()
    }

    /// Whether kubectl is installed.
    pub fn available() -> bool {
        std::process::Command::new("kubectl")
            .args(["version", "--client"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// A kubectl command for this server, to spawn (watches) or run.
    pub fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut c = tokio::process::Command::new("kubectl");
        c.env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", self.dir.path())
            .arg("--cache-dir")
            .arg(self.dir.path().join("cache"))
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        c
    }

    pub async fn run(&self, args: &[&str]) -> Out {
        let out = self
            .command(args)
            .output()
            .await
            .expect("kubectl runs (it is installed on the machine image)");
        Out {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    pub async fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        assert!(
            out.ok,
            "kubectl {args:?} failed:\n{}\n{}",
            out.stdout, out.stderr
        );
        out.stdout
    }

    pub async fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&a).await).expect("kubectl printed JSON")
    }

    /// Polls `kubectl get <args> -o json` until `check` holds (panics with the last answer after
    /// 30s).
    pub async fn wait_json(
        &self,
        args: &[&str],
        what: &str,
        check: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let mut last = serde_json::Value::Null;
        for _ in 0..150 {
            last = self.json(args).await;
            if check(&last) {
                return last;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        panic!("never {what}: {last:#}");
    }
}
