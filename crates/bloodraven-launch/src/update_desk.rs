//! An ordered update's command for tests and the playground, whose servers belong to a
//! [`Launcher`] in this process: the command (`sh`, run by the operator with the site's name
//! in `BLOODRAVEN_SITE`) leaves a request file in the desk's directory and waits; the desk,
//! served by the process that owns the servers, restarts that server with its next setting and
//! answers. The command exits 0 once the server is back, 1 when the restart failed. Asking
//! again (a restarted operator runs the command in progress again) restarts it again.

use std::path::{Path, PathBuf};

use crate::mysql::Launcher;

/// The directory the command and the desk meet in.
#[derive(Clone, Debug)]
pub struct UpdateDesk {
    dir: PathBuf,
}

const SCRIPT: &str = r#"d="$0"; s="$BLOODRAVEN_SITE"
rm -f "$d/$s.done" "$d/$s.failed"
echo "asking for a restart of $s ($BLOODRAVEN_MYSQL_HOST:$BLOODRAVEN_MYSQL_PORT)"
: > "$d/$s.request"
while [ ! -e "$d/$s.done" ] && [ ! -e "$d/$s.failed" ]; do sleep 0.05; done
if [ -e "$d/$s.failed" ]; then cat "$d/$s.failed" >&2; exit 1; fi
echo "$s restarted""#;

impl UpdateDesk {
    /// A desk in `dir` (created).
    pub fn new(dir: &Path) -> std::io::Result<UpdateDesk> {
        std::fs::create_dir_all(dir)?;
        Ok(UpdateDesk {
            dir: dir.to_path_buf(),
        })
    }

    /// The update command of every site (`spec.sites[].update.command`).
    pub fn command(&self) -> Vec<String> {
        vec![
            "sh".into(),
            "-c".into(),
            SCRIPT.into(),
            self.dir.display().to_string(),
        ]
    }

    /// The sites whose update command waits for a restart now.
    pub fn pending(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut asked: Vec<String> = entries
            .flatten()
            .filter_map(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_suffix(".request"))
                    .map(String::from)
            })
            .collect();
        asked.sort();
        asked
    }

    /// Serves the requests waiting now: each server asked for is stopped and started again
    /// with `args(index)` added to its command line. Returns the sites restarted.
    pub async fn serve(
        &self,
        launcher: &mut Launcher,
        args: impl Fn(usize) -> Vec<String>,
    ) -> Vec<String> {
        let mut served = Vec::new();
        for site in self.pending() {
            let _ = std::fs::remove_file(self.dir.join(format!("{site}.request")));
            let result = match launcher.index_of(&site) {
                Some(i) => {
                    let restarted = async {
                        launcher.set_extra_args(i, args(i))?;
                        launcher.stop(i).await?;
                        launcher.restart(i).await
                    };
                    restarted.await.map_err(|e| e.to_string())
                }
                None => Err(format!("no server named {site}")),
            };
            match result {
                Ok(()) => {
                    let _ = std::fs::write(self.dir.join(format!("{site}.done")), "");
                    served.push(site);
                }
                Err(e) => {
                    let _ = std::fs::write(self.dir.join(format!("{site}.failed")), e);
                }
            }
        }
        served
    }
}
