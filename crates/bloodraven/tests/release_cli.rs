//! `bloodraven release` end to end: the real binary, a kubeconfig pointing at the test kit's
//! fake Kubernetes API server.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use bloodraven_testkit::fake_k8s::FakeK8s;
use serde_json::Value;

struct Env {
    fake: FakeK8s,
    dir: tempfile::TempDir,
}

async fn env() -> Env {
    let fake = FakeK8s::start().await;
    fake.add_deployment("shop", "web", "registry.example/web:1.0", 2);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
         contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: nobody\n    \
         namespace: shop\ncurrent-context: fake\nusers:\n- name: nobody\n  user: {{}}\n",
        fake.url
    );
    std::fs::write(dir.path().join("kubeconfig"), kubeconfig).unwrap();
    Env { fake, dir }
}

impl Env {
    async fn run(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_bloodraven"));
        cmd.arg("release")
            .args(args)
            .arg("--kubeconfig")
            .arg(self.dir.path().join("kubeconfig"))
            .arg("--records-dir")
            .arg(self.dir.path().join("records"))
            .stdin(Stdio::null())
            .env_remove("KUBECONFIG");
        tokio::task::spawn_blocking(move || cmd.output().unwrap())
            .await
            .unwrap()
    }

    /// `bloodraven release ARGS`, asserted to exit with `code`.
    async fn run_expecting(&self, args: &[&str], code: i32) -> Output {
        let out = self.run(args).await;
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", stderr(&out));
        out
    }

    /// [`Env::run_expecting`], and the complaint on standard error names `says`.
    async fn refused(&self, args: &[&str], code: i32, says: &str) {
        let out = self.run_expecting(args, code).await;
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }

    /// `bloodraven release image web app=registry.example/web:2.0 EXTRA…`, asserted to exit
    /// with `code`.
    async fn web_2_0(&self, extra: &[&str], code: i32) -> Output {
        let args = [&["image", "web", "app=registry.example/web:2.0"], extra].concat();
        self.run_expecting(&args, code).await
    }

    fn image(&self) -> String {
        let d = self.fake.deployment("shop", "web");
        d.spec.unwrap().template.spec.unwrap().containers[0]
            .image
            .clone()
            .unwrap()
    }
}

fn json(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn yes_with_json_output_applies_and_records() {
    let env = env().await;
    let selected = ["--app-selector", "app=web", "--yes", "-o", "json"];
    let v = json(&env.web_2_0(&selected, 0).await);
    assert_eq!(v["outcome"], "ready");
    assert_eq!(
        v["plan"]["namespace"], "shop",
        "namespace from the kubeconfig context"
    );
    assert_eq!(
        v["plan"]["change"]["targetImage"],
        "registry.example/web:2.0"
    );
    assert_eq!(env.image(), "registry.example/web:2.0");
    let record = v["record"].as_str().unwrap();
    assert!(Path::new(record).exists());

    let h = json(
        &env.run_expecting(&["history", "web", "-o", "json"], 0)
            .await,
    );
    assert_eq!(h["releases"][0]["id"], v["plan"]["id"]);
    assert_eq!(h["releases"][0]["outcome"], "ready");

    // Nothing older to go back to: no plan, its own exit code.
    let rollback = ["rollback", "web", "--app-selector", "app=web", "--yes"];
    env.refused(&rollback, 3, "no successful image release")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_yes_and_without_a_terminal_nothing_is_applied() {
    let env = env().await;
    let out = env.web_2_0(&["--app-selector", "app=web"], 4).await;
    assert!(
        stderr(&out).contains("stdin is not a terminal"),
        "{}",
        stderr(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("registry.example/web:1.0 → registry.example/web:2.0")
    );
    assert_eq!(env.image(), "registry.example/web:1.0");
    assert_eq!(env.fake.deployment_updates("shop", "web"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_pre_check_is_no_plan() {
    let env = env().await;
    let same = ["image", "web", "app=registry.example/web:1.0"];
    let args = [&same[..], &["--no-app-check", "--yes"]].concat();
    env.refused(&args, 3, "IMAGE: must differ").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_names_the_argument_and_the_rule() {
    let env = env().await;
    for (args, message) in [
        (
            vec!["scale", "web", "1001"],
            "REPLICAS: must be between 0 and 1000",
        ),
        (
            vec!["scale", "web", "-3"],
            "REPLICAS: must be between 0 and 1000",
        ),
        (
            vec!["image", "web", "registry.example/web:2.0"],
            "CONTAINER=IMAGE: must be",
        ),
        (
            vec!["restart", "Web_App"],
            "DEPLOYMENT: must consist of lowercase",
        ),
        (
            vec!["restart", "web", "-n", "Shop"],
            "--namespace: must consist of lowercase",
        ),
        (
            vec!["restart", "web"],
            "name the application this release is for",
        ),
        (
            vec!["restart", "web", "--app-selector", "app in web"],
            "--app-selector: term 1 (\"app in web\"): in needs a parenthesised list",
        ),
        (
            vec![
                "restart",
                "web",
                "--app",
                "web",
                "--apps",
                "/nonexistent/apps.yaml",
            ],
            "--apps /nonexistent/apps.yaml: cannot read it",
        ),
        (
            vec!["restart", "web", "--app", "web", "--no-app-check"],
            "cannot be used with",
        ),
    ] {
        env.refused(&args, 2, message).await;
    }
    assert!(
        env.fake.seen().is_empty(),
        "bad input never reaches the cluster"
    );
}

/// The application check from the command line: an applications file names web's namespace
/// and selector; web's image into the api Deployment is refused before anything is sent;
/// `--no-app-check` goes on and is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_application_is_named_and_checked_before_anything_is_sent() {
    let env = env().await;
    env.fake
        .add_deployment("shop", "api", "registry.example/api:1.0", 2);
    let apps = env.dir.path().join("apps.yaml");
    std::fs::write(
        &apps,
        "applications:\n  - name: web\n    namespace: shop\n    selector: app=web\n  - name: api\n    namespace: shop\n    selector: app=api\n",
    )
    .unwrap();
    let apps = apps.to_str().unwrap();

    let web_into_api = ["image", "api", "app=registry.example/web:2.0"];
    let args = [
        &web_into_api[..],
        &["--app", "web", "--apps", apps, "--yes"],
    ]
    .concat();
    let out = env.run_expecting(&args, 3).await;
    assert!(
        stderr(&out).contains("application web's selector app=web")
            && stderr(&out).contains("the Pod template has app=api"),
        "{}",
        stderr(&out)
    );
    assert_eq!(env.fake.dry_runs(), 0, "refused before any dry-run");
    assert_eq!(env.fake.deployment_updates("shop", "api"), 0);

    let unknown = ["restart", "web", "--app", "billing", "--apps", apps];
    env.refused(&unknown, 2, "no such application").await;

    let named = ["--app", "web", "--apps", apps, "--yes", "-o", "json"];
    let v = json(&env.web_2_0(&named, 0).await);
    assert_eq!(v["plan"]["app"]["name"], "web");
    assert_eq!(v["plan"]["app"]["selector"], "app=web");

    let scale = ["scale", "api", "3", "--no-app-check", "--yes", "-o", "json"];
    let v = json(&env.run_expecting(&scale, 0).await);
    assert_eq!(v["plan"]["app"]["checkSkipped"], true);
    let record = std::fs::read_to_string(v["record"].as_str().unwrap()).unwrap();
    assert!(
        record.lines().all(|l| l.contains("\"checkSkipped\":true")),
        "{record}"
    );
}
