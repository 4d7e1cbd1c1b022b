//! The runner contract, run for real: `bash nomad/runner/entrypoint.sh` against stand-ins
//! of the actions runner (`config.sh`, `run.sh`, a `Runner.Worker` process that runs the job)
//! and of forgejo-runner, written to a temporary directory, and a stand-in Vault serving the
//! single-use `sys/wrapping/unwrap`.
//!
//! The stand-ins record their argv, their environment and the signals they get to files; the
//! tests wait on those files and on the entrypoint's exit, each with a generous deadline, and
//! never sleep to synchronise.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(60);

const REPO_URL: &str = "https://github.com/acme/api";
const RUNNER_NAME: &str = "ci-runner-0123456789ab";
const LABELS: &str = "self-hosted,linux";
/// A registration token: short, upper-case.
const REGISTRATION_TOKEN: &str = "AABBCCDDEEFFGGHHIIJJKKLLMMN01";
/// Secrets the task may hold that no job may see.
const PARENT_VAULT_TOKEN: &str = "hvs.the-tasks-own-vault-token";
const NOMAD_TOKEN: &str = "nomad-secret-identity-token";

/// An encoded JIT config: base64 of a JSON object, as GitHub's `encoded_jit_config`.
fn jit_config() -> String {
    use base64::Engine;
    let inner = json!({
        ".runner": "eyJhZ2VudElkIjoxLCJ3b3JrRm9sZGVyIjoiX3dvcmsifQ==",
        ".credentials": "eyJzY2hlbWUiOiJPQXV0aCJ9",
        ".credentials_rsaparams": "eyJkIjoic2VjcmV0LXByaXZhdGUta2V5LW1hdGVyaWFsIn0=",
    });
    base64::engine::general_purpose::STANDARD.encode(inner.to_string())
}

fn repo_path(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// A scratch directory of one test, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "runner-entrypoint-{name}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["home", "task", "tmp", "record", "bin", "alloc"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        Scratch(dir)
    }

    fn path(&self, sub: &str) -> PathBuf {
        self.0.join(sub)
    }

    fn record(&self, name: &str) -> Option<String> {
        std::fs::read_to_string(self.path("record").join(name)).ok()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn write_script(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// How the stand-in listener behaves.
#[derive(Clone, Copy)]
enum Listener {
    /// Takes a job at once: prints `Running job:`, runs a short Runner.Worker, exits 0.
    Job,
    /// Takes a job without printing anything, whose Runner.Worker runs for `seconds`.
    QuietJob { seconds: u32 },
    /// Never gets a job: waits for a signal, records it and exits 0.
    Idle,
    /// Gets its job just as it is told to stop: records the signal, then runs the job.
    JobAtStop,
}

/// The stand-in actions runner in `home/`: `config.sh` and `run.sh` record their argv and
/// environment. `run.sh` models what the real listener does with a job: it hands the job to
/// a process whose argv[0] is `Runner.Worker`, which records the environment job steps
/// inherit. Like the real listener, it drops the `ACTIONS_RUNNER_INPUT_*` values it read from
/// what it hands on (actions/runner src/Runner.Listener/CommandSettings.cs).
fn install_actions_runner(scratch: &Scratch, listener: Listener) {
    let record = scratch.path("record");
    let record = record.display();
    write_script(
        &scratch.path("home/config.sh"),
        &format!(
            r#"#!/usr/bin/env bash
printf '%s\n' "$@" > '{record}/config.argv'
env > '{record}/config.env'
"#
        ),
    );
    let (mode, job_seconds) = match listener {
        Listener::Job => ("job", 0),
        Listener::QuietJob { seconds } => ("quiet-job", seconds),
        Listener::Idle => ("idle", 0),
        Listener::JobAtStop => ("job-at-stop", 1),
    };
    write_script(
        &scratch.path("home/run.sh"),
        &format!(
            r#"#!/usr/bin/env bash
# Traps first: the entrypoint may stop an idle runner as soon as it started.
# The trap also ends the sleep being waited for: a signal handled just before `wait` starts
# (bash runs traps between commands) would otherwise leave the wait to run its full length.
got= s=
stop() {{ got=$1; [ -n "$s" ] && kill "$s" 2>/dev/null; }}
trap 'stop INT' INT
trap 'stop TERM' TERM
r='{record}'
printf '%s\n' "$@" > "$r/run.argv"
env > "$r/run.env"
unset ACTIONS_RUNNER_INPUT_JITCONFIG
job() {{
  [ "$1" = loud ] && echo "2026-01-01 00:00:00Z: Running job: build"
  # `sleep & wait`: bash would exec a last plain command and lose the Runner.Worker name.
  # A job step may read /proc/PID/environ of every process of its uid above it: what each
  # ancestor was started with, whatever it unset later, goes to ancestors.environ.
  exec -a Runner.Worker bash -c '
    env > "$1"; seconds=$2; out=$3; p=$PPID
    while [ "$p" -gt 1 ]; do
      tr "\0" "\n" < "/proc/$p/environ" >> "$out" 2>/dev/null
      stat=$(< "/proc/$p/stat") || break
      stat=${{stat##*) }}
      set -- $stat
      p=$2
    done
    sleep "$seconds" & wait' _ "$r/worker.env" {job_seconds} "$r/ancestors.environ" &
  wait $!
  echo done > "$r/job.done"
}}
case {mode} in
  job) job loud; exit 0 ;;
  quiet-job) job quiet; exit 0 ;;
esac
: > "$r/listening"
while [ -z "$got" ]; do
  sleep 600 & s=$!
  [ -n "$got" ] || wait $s
  kill $s 2>/dev/null
done
echo "$got" >> "$r/run.signals"
[ {mode} = job-at-stop ] && job loud
exit 0
"#
        ),
    );
}

/// The stand-in forgejo-runner in `bin/`: `register` records its argv; `one-job` copies the
/// `.runner` file it finds, then either takes a task (logs `task N repo is …` like
/// forgejo-runner's runner.go and runs a step that records its environment) or finds none.
fn install_forgejo_runner(scratch: &Scratch, has_task: bool) {
    let record = scratch.path("record");
    let record = record.display();
    write_script(
        &scratch.path("bin/forgejo-runner"),
        &format!(
            r#"#!/usr/bin/env bash
r='{record}'
command=$1
shift
[ "$1" = -c ] && {{ cp "$2" "$r/config.yml"; shift 2; }}
case $command in
  register)
    printf '%s\n' "$@" > "$r/register.argv"
    env > "$r/register.env"
    echo '{{"uuid":"from-register","token":"t"}}' > .runner
    ;;
  one-job)
    printf '%s\n' "$@" > "$r/one-job.argv"
    env > "$r/one-job.env"
    cp .runner "$r/runner-file"
    if {has_task}; then
      echo 'level=info msg="task 7 repo is acme/api https://code.example.org"'
      bash -c 'env > "$1"' _ "$r/step.env"
      exit 0
    fi
    echo 'level=error msg="could not fetch task"'
    exit 1
    ;;
esac
"#
        ),
    );
}

/// The entrypoint with a test's environment: nothing inherited but PATH.
fn entrypoint(scratch: &Scratch, env: &[(&str, &str)]) -> Command {
    let mut command = Command::new("bash");
    command
        .arg(repo_path("nomad/runner/entrypoint.sh"))
        .env_clear()
        .env(
            "PATH",
            format!(
                "{}:{}",
                scratch.path("bin").display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .env("HOME", scratch.path("tmp"))
        .env("TMPDIR", scratch.path("tmp"))
        .env("LANG", "C.UTF-8")
        .env("RUNNER_HOME", scratch.path("home"))
        .env("NOMAD_TASK_DIR", scratch.path("task"))
        .env("NOMAD_ALLOC_DIR", scratch.path("alloc"))
        .env("REPO_URL", REPO_URL)
        .env("RUNNER_NAME", RUNNER_NAME)
        .env("RUNNER_LABELS", LABELS)
        .env("NOMAD_META_repo_url", REPO_URL)
        .env("VAULT_TOKEN", PARENT_VAULT_TOKEN)
        .env("NOMAD_TOKEN", NOMAD_TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    command
}

struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Waits for the child to exit, within the deadline; kills it if it does not. A thread waits
/// on the process and hands its output over a channel: the exit is the signal, nothing polls.
fn finish(child: Child) -> Finished {
    let pid = child.id() as i32;
    let (done_tx, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done_tx.send(child.wait_with_output());
    });
    let output = match done.recv_timeout(DEADLINE) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            // SAFETY: kill(2) on our own child's pid, which the waiting thread has not reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            // The stand-in runner lives in its own process group and may keep the pipes open
            // long after the entrypoint is gone: give up on its output rather than wait it out.
            match done.recv_timeout(Duration::from_secs(5)) {
                Ok(Ok(output)) => panic!(
                    "the entrypoint did not exit within {DEADLINE:?}\nstdout:\n{}\nstderr:\n{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                ),
                _ => panic!(
                    "the entrypoint did not exit within {DEADLINE:?}, and a process it started \
                     still holds its output"
                ),
            }
        }
    };
    Finished {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn run(mut command: Command) -> Finished {
    finish(command.spawn().expect("bash runs"))
}

/// Makes `path` a FIFO: the stand-in's `: > path` then blocks until [`wait_for_signal`] reads
/// it, so the test learns the moment it happened without polling.
fn make_fifo(path: &Path) {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path we own.
    assert_eq!(
        unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) },
        0,
        "mkfifo {}",
        path.display()
    );
}

/// Blocks until the stand-in writes the FIFO at `path`, within the deadline.
fn wait_for_signal(path: &Path) {
    let (opened_tx, opened) = std::sync::mpsc::channel();
    let path_owned = path.to_path_buf();
    std::thread::spawn(move || {
        let _ = opened_tx.send(std::fs::read(&path_owned));
    });
    opened
        .recv_timeout(DEADLINE)
        .unwrap_or_else(|_| panic!("{} was never written", path.display()))
        .unwrap();
}

impl Finished {
    fn code(&self) -> i32 {
        self.status
            .code()
            .unwrap_or_else(|| panic!("killed by a signal: {:?}\n{}", self.status, self.context()))
    }

    fn context(&self) -> String {
        format!("stdout:\n{}\nstderr:\n{}", self.stdout, self.stderr)
    }

    fn assert_code(&self, expected: i32) {
        assert_eq!(self.code(), expected, "{}", self.context());
    }
}

/// `NAME=value` lines as a map.
fn env_map(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn assert_holds_none(what: &str, text: &str, secrets: &[&str]) {
    for secret in secrets {
        assert!(
            !text.contains(secret),
            "{what} holds the secret {secret}:\n{text}"
        );
    }
}

// ---- the stand-in Vault ----

#[derive(Default)]
struct VaultState {
    /// Wrapping token → wrapped data; removed by the first unwrap.
    wrapped: HashMap<String, Value>,
    /// What each unwrap request carried: its X-Vault-Token, whether it had any other
    /// credential header, and its body.
    requests: Vec<(String, bool, String)>,
}

type Vault = Arc<Mutex<VaultState>>;

async fn unwrap(
    State(vault): State<Vault>,
    headers: HeaderMap,
    body: String,
) -> (StatusCode, String) {
    let token = headers
        .get("x-vault-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let mut state = vault.lock().unwrap();
    state.requests.push((
        token.clone(),
        headers.contains_key("authorization"),
        body.clone(),
    ));
    // Unwrapping with another token and the wrapping token in the body is Vault's other form;
    // the runner must use the first, so anything else is refused here.
    if !body.is_empty() {
        return (
            StatusCode::BAD_REQUEST,
            json!({"errors": ["unexpected body"]}).to_string(),
        );
    }
    match state.wrapped.remove(&token) {
        Some(data) => (
            StatusCode::OK,
            json!({
                "request_id": "2c6f3b1e-0000-0000-0000-000000000000",
                "lease_id": "",
                "renewable": false,
                "lease_duration": 0,
                "data": data,
                "wrap_info": null,
                "warnings": null,
                "auth": null
            })
            .to_string(),
        ),
        None => (
            StatusCode::BAD_REQUEST,
            json!({"errors": ["wrapping token is not valid or does not exist"]}).to_string(),
        ),
    }
}

/// A Vault on 127.0.0.1 that knows `wrapped`; its address and its state.
fn start_vault(wrapped: &[(&str, Value)]) -> (String, Vault) {
    let vault: Vault = Arc::default();
    for (token, data) in wrapped {
        vault
            .lock()
            .unwrap()
            .wrapped
            .insert(token.to_string(), data.clone());
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let state = vault.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let app = axum::Router::new()
                .route("/v1/sys/wrapping/unwrap", post(unwrap))
                .with_state(state);
            axum::serve(listener, app).await.unwrap();
        });
    });
    (address, vault)
}

// ---- GitHub ----

#[test]
fn a_jit_config_reaches_the_listener_only_through_its_input_variable_and_no_job_sees_a_secret() {
    let scratch = Scratch::new("jit");
    install_actions_runner(&scratch, Listener::Job);
    let jit = jit_config();
    let done = run(entrypoint(
        &scratch,
        &[
            ("RUNNER_TOKEN", &jit),
            ("NOMAD_META_runner_token", &jit),
            ("RUNNER_IDLE_TIMEOUT", "60"),
        ],
    ));
    done.assert_code(0);

    assert!(
        scratch.record("config.argv").is_none(),
        "no config.sh with a JIT config"
    );
    let argv = scratch.record("run.argv").expect("run.sh ran");
    assert_holds_none("run.sh's command line", &argv, &[&jit]);
    let listener = env_map(&scratch.record("run.env").unwrap());
    assert_eq!(listener.get("ACTIONS_RUNNER_INPUT_JITCONFIG"), Some(&jit));
    assert_eq!(
        listener.get("RUNNER_MANUALLY_TRAP_SIG").map(String::as_str),
        Some("1")
    );
    for name in [
        "RUNNER_TOKEN",
        "NOMAD_META_runner_token",
        "VAULT_TOKEN",
        "NOMAD_TOKEN",
    ] {
        assert!(!listener.contains_key(name), "the listener inherits {name}");
    }
    assert_holds_none(
        "the listener's environment",
        &scratch.record("run.env").unwrap(),
        &[PARENT_VAULT_TOKEN, NOMAD_TOKEN],
    );

    let worker = scratch.record("worker.env").expect("Runner.Worker ran");
    assert_holds_none(
        "the job's environment",
        &worker,
        &[&jit, PARENT_VAULT_TOKEN, NOMAD_TOKEN, "NOMAD_META_"],
    );
    let worker = env_map(&worker);
    assert_eq!(
        worker.get("LANG").map(String::as_str),
        Some("C.UTF-8"),
        "allowed variables pass"
    );
    // The JIT config's default work folder (_work) is this allocation's work directory.
    let work = std::fs::read_link(scratch.path("home/_work")).expect("_work is a link");
    assert_eq!(work, scratch.path("task/work"));
}

/// The two layers are separate: the credential variables are unset before the listener
/// starts, so even an allow-list that names them (an operator's mistake) passes none on.
#[test]
fn secrets_stay_out_even_when_the_allow_list_names_them() {
    let scratch = Scratch::new("allow-list");
    install_actions_runner(&scratch, Listener::Job);
    let done = run(entrypoint(
        &scratch,
        &[
            ("RUNNER_TOKEN", REGISTRATION_TOKEN),
            ("NOMAD_META_runner_token", REGISTRATION_TOKEN),
            (
                "RUNNER_ENV_ALLOW",
                "RUNNER_TOKEN NOMAD_META_runner_token VAULT_TOKEN NOMAD_TOKEN NOMAD_META_repo_url",
            ),
        ],
    ));
    done.assert_code(0);
    for (what, file) in [("the listener", "run.env"), ("the job", "worker.env")] {
        let env = scratch.record(file).expect("recorded");
        assert_holds_none(
            &format!("{what}'s environment"),
            &env,
            &[REGISTRATION_TOKEN, PARENT_VAULT_TOKEN, NOMAD_TOKEN],
        );
        // The allow-list itself works: a harmless name it lists passes.
        assert!(
            env.contains(&format!("NOMAD_META_repo_url={REPO_URL}")),
            "{what}: {env}"
        );
    }
}

#[test]
fn a_registration_token_registers_one_ephemeral_runner_with_config_sh_then_runs() {
    let scratch = Scratch::new("registration");
    install_actions_runner(&scratch, Listener::Job);
    let done = run(entrypoint(
        &scratch,
        &[
            ("RUNNER_TOKEN", REGISTRATION_TOKEN),
            ("RUNNER_FORGE", "github"),
        ],
    ));
    done.assert_code(0);

    let argv: Vec<String> = scratch
        .record("config.argv")
        .expect("config.sh ran")
        .lines()
        .map(str::to_string)
        .collect();
    let work = scratch.path("task/work").display().to_string();
    for pair in [
        ["--url", REPO_URL],
        ["--name", RUNNER_NAME],
        ["--labels", LABELS],
        ["--work", &work],
    ] {
        assert!(
            argv.windows(2).any(|w| w[0] == pair[0] && w[1] == pair[1]),
            "config.sh without {pair:?}: {argv:?}"
        );
    }
    for flag in [
        "--unattended",
        "--ephemeral",
        "--disableupdate",
        "--no-default-labels",
    ] {
        assert!(
            argv.iter().any(|a| a == flag),
            "config.sh without {flag}: {argv:?}"
        );
    }
    assert_holds_none(
        "config.sh's command line",
        &argv.join(" "),
        &[REGISTRATION_TOKEN],
    );
    let config_env = env_map(&scratch.record("config.env").unwrap());
    assert_eq!(
        config_env
            .get("ACTIONS_RUNNER_INPUT_TOKEN")
            .map(String::as_str),
        Some(REGISTRATION_TOKEN)
    );

    for (what, file) in [
        ("the listener", "run.env"),
        ("the job", "worker.env"),
        (
            "every process above the job at its start",
            "ancestors.environ",
        ),
    ] {
        assert_holds_none(
            &format!("{what}'s environment"),
            &scratch.record(file).expect("recorded"),
            &[REGISTRATION_TOKEN, PARENT_VAULT_TOKEN, NOMAD_TOKEN],
        );
    }
}

#[test]
fn a_wrapped_credential_is_unwrapped_once_with_only_the_wrapping_token() {
    let scratch = Scratch::new("wrapped");
    install_actions_runner(&scratch, Listener::Job);
    let jit = jit_config();
    let wrapping = "hvs.CAESIwrapping-token-of-this-runner";
    let (address, vault) = start_vault(&[(wrapping, json!({ "jitconfig": jit }))]);
    let done = run(entrypoint(
        &scratch,
        &[("RUNNER_TOKEN", wrapping), ("VAULT_ADDR", &address)],
    ));
    done.assert_code(0);

    let requests = vault.lock().unwrap().requests.clone();
    assert_eq!(requests.len(), 1, "one unwrap");
    let (token, other_credential, body) = &requests[0];
    assert_eq!(token, wrapping, "the wrapping token is the X-Vault-Token");
    assert!(!other_credential, "no other token");
    assert!(body.is_empty(), "no body");

    let listener = env_map(&scratch.record("run.env").expect("run.sh ran"));
    assert_eq!(listener.get("ACTIONS_RUNNER_INPUT_JITCONFIG"), Some(&jit));
    assert_holds_none(
        "the job's environment",
        &scratch.record("worker.env").unwrap(),
        &[wrapping, &jit, PARENT_VAULT_TOKEN],
    );
    // The listener itself was started with the JIT config (the actions runner reads it from
    // ACTIONS_RUNNER_INPUT_JITCONFIG), so only the other secrets are checked above the job.
    assert_holds_none(
        "the environment of every process above the job at its start",
        &scratch.record("ancestors.environ").unwrap(),
        &[wrapping, PARENT_VAULT_TOKEN, NOMAD_TOKEN],
    );
    assert_holds_none(
        "the entrypoint's output",
        &done.context(),
        &[wrapping, &jit],
    );
}

#[test]
fn a_credential_someone_else_unwrapped_first_exits_4_and_never_registers() {
    let scratch = Scratch::new("stolen");
    install_actions_runner(&scratch, Listener::Job);
    let wrapping = "hvs.CAESIstolen-wrapping-token";
    let (address, _vault) = start_vault(&[]);
    let child = "ci-runner/dispatch-acme-api-1764590400-5b1e0c2a";
    let allocation = "8c2d7e4a-1f0b-4c3e-9a6d-2b5f0e7c1d93";
    let done = run(entrypoint(
        &scratch,
        &[
            ("RUNNER_TOKEN", wrapping),
            ("VAULT_ADDR", &address),
            ("NOMAD_JOB_ID", child),
            ("NOMAD_ALLOC_ID", allocation),
            ("NOMAD_NAMESPACE", "ci-runners"),
        ],
    ));
    done.assert_code(4);
    assert!(
        done.stderr.contains("possible credential theft"),
        "{}",
        done.context()
    );
    // A replacement allocation of the same child (after a lost node or a drain) finds the
    // credential its first allocation spent: the log names this allocation and the command
    // that lists the child's allocations, so the two can be told apart.
    assert!(
        done.stderr
            .contains(&format!("this is allocation {allocation} of {child}")),
        "{}",
        done.context()
    );
    assert!(
        done.stderr
            .contains(&format!("`nomad job status -namespace ci-runners {child}`")),
        "{}",
        done.context()
    );
    assert_holds_none("the entrypoint's output", &done.context(), &[wrapping]);
    assert!(scratch.record("config.argv").is_none());
    assert!(scratch.record("run.argv").is_none(), "no listener started");
}

/// The real curl on this machine's PATH, for stand-ins that record their argv and then run it.
fn real_curl() -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join("curl"))
        .find(|path| path.is_file())
        .expect("curl on PATH: the entrypoint unwraps with it")
}

/// A `curl` in `bin/` (ahead of the real one on the entrypoint's PATH) that records its argv,
/// one argument a line, then runs the real curl with the same arguments and descriptors.
fn install_recording_curl(scratch: &Scratch) {
    let record = scratch.path("record");
    write_script(
        &scratch.path("bin/curl"),
        &format!(
            "#!/usr/bin/env bash\nprintf '%s\\n' \"$@\" > '{}/curl.argv'\nexec '{}' \"$@\"\n",
            record.display(),
            real_curl().display()
        ),
    );
}

/// The job files always set VAULT_CACERT and render it from an optional Nomad Variable: a
/// non-empty file (a private CA) is Vault's CA for the unwrap, an empty one (no Variable, a
/// public CA) is left out so the system CAs decide.
#[test]
fn a_vault_cacert_file_with_a_ca_reaches_curl_and_an_empty_one_does_not() {
    for (name, ca, expect_cacert) in [
        (
            "ca",
            "-----BEGIN CERTIFICATE-----\nnot-checked-over-http\n-----END CERTIFICATE-----\n",
            true,
        ),
        ("no-ca", "", false),
    ] {
        let scratch = Scratch::new(&format!("vault-cacert-{name}"));
        install_actions_runner(&scratch, Listener::Job);
        install_recording_curl(&scratch);
        std::fs::create_dir_all(scratch.path("task/ca")).unwrap();
        let cacert = scratch.path("task/ca/vault.pem");
        std::fs::write(&cacert, ca).unwrap();
        let wrapping = "hvs.CAESIwrapping-token-with-a-ca";
        let (address, vault) = start_vault(&[(wrapping, json!({ "jitconfig": jit_config() }))]);
        let done = run(entrypoint(
            &scratch,
            &[
                ("RUNNER_TOKEN", wrapping),
                ("VAULT_ADDR", &address),
                ("VAULT_CACERT", cacert.to_str().unwrap()),
            ],
        ));
        done.assert_code(0);
        assert_eq!(
            vault.lock().unwrap().requests.len(),
            1,
            "{name}: one unwrap"
        );

        let argv: Vec<String> = scratch
            .record("curl.argv")
            .expect("the entrypoint unwrapped with curl")
            .lines()
            .map(str::to_string)
            .collect();
        let given = argv
            .windows(2)
            .find(|w| w[0] == "--cacert")
            .map(|w| w[1].clone());
        if expect_cacert {
            assert_eq!(given.as_deref(), cacert.to_str(), "{name}: {argv:?}");
        } else {
            assert_eq!(
                given, None,
                "{name}: an empty CA file given to curl: {argv:?}"
            );
        }
        assert_holds_none("curl's command line", &argv.join(" "), &[wrapping]);
    }
}

#[test]
fn an_idle_runner_is_stopped_with_sigint_and_exits_3() {
    let scratch = Scratch::new("idle");
    install_actions_runner(&scratch, Listener::Idle);
    let done = run(entrypoint(
        &scratch,
        &[
            ("RUNNER_TOKEN", &jit_config()),
            ("RUNNER_IDLE_TIMEOUT", "1s"),
        ],
    ));
    done.assert_code(3);
    assert_eq!(scratch.record("run.signals").as_deref(), Some("INT\n"));
}

#[test]
fn a_job_running_at_the_idle_timeout_keeps_the_runner_and_exits_0() {
    let scratch = Scratch::new("busy-at-timeout");
    // The job starts at once, outlasts the timeout three times over and says nothing on the
    // listener's output: only the Runner.Worker process shows it. (Three seconds leave the
    // stand-in time to start its worker on a loaded machine.)
    install_actions_runner(&scratch, Listener::QuietJob { seconds: 9 });
    let done = run(entrypoint(
        &scratch,
        &[
            ("RUNNER_TOKEN", &jit_config()),
            ("RUNNER_IDLE_TIMEOUT", "3"),
        ],
    ));
    done.assert_code(0);
    assert!(scratch.record("job.done").is_some());
    assert!(
        scratch.record("run.signals").is_none(),
        "the busy runner was signalled"
    );
}

#[test]
fn a_job_arriving_as_the_runner_stops_is_waited_for_and_exits_0() {
    let scratch = Scratch::new("job-at-stop");
    install_actions_runner(&scratch, Listener::JobAtStop);
    let done = run(entrypoint(
        &scratch,
        &[
            ("RUNNER_TOKEN", &jit_config()),
            ("RUNNER_IDLE_TIMEOUT", "1s"),
        ],
    ));
    done.assert_code(0);
    assert_eq!(
        scratch.record("run.signals").as_deref(),
        Some("INT\n"),
        "one stop only"
    );
    assert!(
        scratch.record("job.done").is_some(),
        "the job ran to its end"
    );
}

#[test]
fn sigterm_reaches_the_listener_and_an_unassigned_runner_exits_3() {
    let scratch = Scratch::new("sigterm");
    install_actions_runner(&scratch, Listener::Idle);
    make_fifo(&scratch.path("record/listening"));
    let child = entrypoint(
        &scratch,
        &[
            ("RUNNER_TOKEN", &jit_config()),
            ("RUNNER_IDLE_TIMEOUT", "15m"),
        ],
    )
    .spawn()
    .unwrap();
    wait_for_signal(&scratch.path("record/listening"));
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let done = finish(child);
    done.assert_code(3);
    assert_eq!(scratch.record("run.signals").as_deref(), Some("TERM\n"));
}

#[test]
fn missing_meta_exits_2() {
    let scratch = Scratch::new("settings");
    install_actions_runner(&scratch, Listener::Job);
    for (name, value) in [
        ("RUNNER_NAME", ""),
        ("RUNNER_NAME", "${NOMAD_META_runner_name}"),
        ("REPO_URL", ""),
        ("RUNNER_TOKEN", ""),
        ("RUNNER_IDLE_TIMEOUT", "soon"),
        ("RUNNER_FORGE", "gitlab"),
    ] {
        let mut command = entrypoint(&scratch, &[("RUNNER_TOKEN", REGISTRATION_TOKEN)]);
        command.env(name, value);
        let done = run(command);
        assert_eq!(done.code(), 2, "{name}={value}: {}", done.context());
    }
    assert!(scratch.record("config.argv").is_none());
}

// ---- Forgejo ----

const RUNNER_UUID: &str = "0b6e4f4a-3c7d-4d3e-9a7e-1f2a3b4c5d6e";
const RUNNER_SECRET: &str = "f0e1d2c3b4a5968778695a4b3c2d1e0f01234567";

#[test]
fn a_forgejo_runner_of_the_daemons_writes_its_runner_file_and_runs_one_job() {
    let scratch = Scratch::new("forgejo");
    install_forgejo_runner(&scratch, true);
    let credential = format!("{RUNNER_UUID}:{RUNNER_SECRET}");
    let done = run(entrypoint(
        &scratch,
        &[
            ("RUNNER_FORGE", "forgejo"),
            ("REPO_URL", "https://code.example.org/acme/api"),
            ("RUNNER_TOKEN", &credential),
        ],
    ));
    done.assert_code(0);
    assert!(
        scratch.record("register.argv").is_none(),
        "no second registration"
    );
    let file: Value = serde_json::from_str(&scratch.record("runner-file").unwrap()).unwrap();
    assert_eq!(file["uuid"], RUNNER_UUID);
    assert_eq!(file["token"], RUNNER_SECRET);
    assert_eq!(file["name"], RUNNER_NAME);
    assert_eq!(file["address"], "https://code.example.org");
    assert_eq!(file["labels"], json!(["self-hosted:host", "linux:host"]));
    let config = scratch.record("config.yml").unwrap();
    assert!(
        config.contains(&scratch.path("task/work").display().to_string()),
        "{config}"
    );
    for (what, file) in [
        ("forgejo-runner", "one-job.env"),
        ("the job step", "step.env"),
    ] {
        assert_holds_none(
            &format!("{what}'s environment"),
            &scratch.record(file).expect("recorded"),
            &[RUNNER_SECRET, PARENT_VAULT_TOKEN, NOMAD_TOKEN],
        );
    }
}

#[test]
fn a_wrapped_forgejo_registration_token_registers_then_an_idle_runner_exits_3() {
    let scratch = Scratch::new("forgejo-idle");
    install_forgejo_runner(&scratch, false);
    let wrapping = "s.legacy-style-wrapping-token";
    let (address, _vault) = start_vault(&[(
        wrapping,
        json!({ "registration_token": REGISTRATION_TOKEN }),
    )]);
    let done = run(entrypoint(
        &scratch,
        &[
            ("RUNNER_FORGE", "forgejo"),
            ("REPO_URL", "https://code.example.org/acme/api"),
            ("RUNNER_TOKEN", wrapping),
            ("VAULT_ADDR", &address),
            ("RUNNER_IDLE_TIMEOUT", "1s"),
        ],
    ));
    done.assert_code(3);
    let argv = scratch.record("register.argv").expect("registered");
    assert!(
        argv.contains(REGISTRATION_TOKEN) && argv.contains("--no-interactive"),
        "{argv}"
    );
    assert_holds_none(
        "forgejo-runner's environment",
        &scratch.record("one-job.env").unwrap(),
        &[REGISTRATION_TOKEN, wrapping, PARENT_VAULT_TOKEN],
    );
}

// ---- vault mode: the prestart task's credential ----

/// What the stand-in GitHub was asked: path, Authorization header, JSON body.
type GithubRequests = Arc<Mutex<Vec<(String, String, Value)>>>;

fn start_github(jit: String) -> (String, GithubRequests) {
    let requests: GithubRequests = Arc::default();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let seen = requests.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let app = axum::Router::new().fallback(
                move |uri: axum::http::Uri, headers: HeaderMap, body: String| {
                    let seen = seen.clone();
                    let jit = jit.clone();
                    async move {
                        let authorization = headers
                            .get("authorization")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_string();
                        let body: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                        seen.lock()
                            .unwrap()
                            .push((uri.path().to_string(), authorization, body));
                        (
                            StatusCode::CREATED,
                            json!({
                                "runner": {"id": 23, "name": RUNNER_NAME, "os": "unknown",
                                           "status": "offline", "busy": false, "labels": []},
                                "encoded_jit_config": jit
                            })
                            .to_string(),
                        )
                    }
                },
            );
            axum::serve(listener, app).await.unwrap();
        });
    });
    (address, requests)
}

/// The vault-mode prestart task's script, as the job file runs it: REPO_URL is the job's own
/// repo, DISPATCHED_REPO_URL the dispatch's repo_url meta, GITHUB_API_URL the stand-in GitHub.
fn mint(
    scratch: &Scratch,
    api: &str,
    header: &Path,
    credential: &Path,
    dispatched: &str,
) -> Finished {
    let mut command = Command::new("bash");
    command
        .arg(repo_path("nomad/runner/mint-github-credential.sh"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("TMPDIR", scratch.path("tmp"))
        .env("REPO_URL", REPO_URL)
        .env("DISPATCHED_REPO_URL", dispatched)
        .env("RUNNER_NAME", RUNNER_NAME)
        .env("RUNNER_LABELS", LABELS)
        .env("GITHUB_API_URL", api)
        .env("GITHUB_AUTH_HEADER_FILE", header)
        .env("RUNNER_CREDENTIAL_FILE", credential)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    run(command)
}

/// Whoever may dispatch the vault-mode parent chooses its meta. A dispatch whose repo_url is
/// not the job's own repo gets no credential minted: the script exits 2 naming both URLs and
/// sends nothing, the admin token included, anywhere.
#[test]
fn vault_mode_refuses_a_dispatch_for_another_repo_and_sends_no_request() {
    let scratch = Scratch::new("vault-mode-other-repo");
    let (api, requests) = start_github(jit_config());
    let admin = "ghp_the-repos-admin-token";
    let header = scratch.path("tmp/github-auth-header");
    std::fs::write(&header, format!("Authorization: Bearer {admin}")).unwrap();
    let credential = scratch.path("alloc/runner-credential");

    for dispatched in [
        "https://attacker.example/x/y",
        "https://github.com/acme/other",
        "https://github.com/acme/api/../other",
        "${NOMAD_META_repo_url}",
        "",
    ] {
        let done = mint(&scratch, &api, &header, &credential, dispatched);
        assert_eq!(done.code(), 2, "{dispatched:?}: {}", done.context());
        if !dispatched.is_empty() && !dispatched.starts_with("${") {
            for url in [dispatched, REPO_URL] {
                assert!(
                    done.stderr.contains(url),
                    "{dispatched}: the refusal names {url}: {}",
                    done.context()
                );
            }
        }
        assert_holds_none("the mint task's output", &done.context(), &[admin]);
    }
    assert!(
        requests.lock().unwrap().is_empty(),
        "a request went out for a dispatch of another repo: {:?}",
        requests.lock().unwrap()
    );
    assert!(!credential.exists(), "a credential was left for the runner");

    // The same repo, written as GitHub also accepts it, is not another repo.
    let done = mint(
        &scratch,
        &api,
        &header,
        &credential,
        "https://GitHub.com/ACME/api/",
    );
    done.assert_code(0);
    assert_eq!(requests.lock().unwrap().len(), 1);
}

#[test]
fn vault_mode_mints_a_jit_config_that_only_the_runner_reads_then_deletes() {
    use std::os::unix::fs::PermissionsExt;
    let scratch = Scratch::new("vault-mode");
    install_actions_runner(&scratch, Listener::Job);
    let jit = jit_config();
    let (api, requests) = start_github(jit.clone());
    let admin = "ghp_the-repos-admin-token";
    let header = scratch.path("tmp/github-auth-header");
    std::fs::write(&header, format!("Authorization: Bearer {admin}")).unwrap();
    let credential = scratch.path("alloc/runner-credential");

    let minted = mint(&scratch, &api, &header, &credential, REPO_URL);
    minted.assert_code(0);
    let asked = requests.lock().unwrap().clone();
    assert_eq!(asked.len(), 1, "one credential minted");
    let (path, authorization, body) = &asked[0];
    assert_eq!(path, "/repos/acme/api/actions/runners/generate-jitconfig");
    assert_eq!(authorization, &format!("Bearer {admin}"));
    assert_eq!(
        body,
        &json!({"name": RUNNER_NAME, "runner_group_id": 1,
                "labels": ["self-hosted", "linux"], "work_folder": "_work"})
    );
    let written = std::fs::read_to_string(&credential).unwrap();
    assert_eq!(
        written.trim_end(),
        jit,
        "only the JIT config is left behind"
    );
    let mode = std::fs::metadata(&credential).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o400, "readable by its owner only");
    assert_holds_none("the mint task's output", &minted.context(), &[admin, &jit]);

    let done = run(entrypoint(
        &scratch,
        &[
            ("RUNNER_CREDENTIAL_FILE", credential.to_str().unwrap()),
            ("RUNNER_CREDENTIAL_WRAPPED", "false"),
        ],
    ));
    done.assert_code(0);
    assert!(
        !credential.exists(),
        "the runner deletes the credential file"
    );
    let listener = env_map(&scratch.record("run.env").expect("run.sh ran"));
    assert_eq!(listener.get("ACTIONS_RUNNER_INPUT_JITCONFIG"), Some(&jit));
    assert_holds_none(
        "the job's environment",
        &scratch.record("worker.env").unwrap(),
        &[admin, &jit],
    );
}
