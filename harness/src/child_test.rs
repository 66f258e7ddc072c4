//! A second worker process for an integration test: the test binary run
//! again with only the child's test, told its role and its config through
//! the environment. The child's test does nothing in a normal run, and the
//! parent's tests do nothing in the child.

use shardq::config::Config;

/// The role the test binary was run again in.
const ROLE_ENV: &str = "SHARDQ_TEST_ROLE";
/// The child's config, as TOML.
const CONFIG_ENV: &str = "SHARDQ_TEST_CONFIG_TOML";

/// Whether this process is a child started by [`spawn`]: a parent's test
/// returns at once then.
pub fn is_child() -> bool {
    std::env::var_os(ROLE_ENV).is_some()
}

/// The config given to this process when it is the child started as `role`;
/// `None` in any other run.
pub fn config_as(role: &str) -> Option<Config> {
    if std::env::var(ROLE_ENV).as_deref() != Ok(role) {
        return None;
    }
    let toml = std::env::var(CONFIG_ENV).expect("the child's config in the environment");
    Some(Config::from_toml(&toml).expect("the child's config is valid"))
}

/// Runs this test binary again as `role` with the config `toml`, running
/// only `test` (its path in the binary, `module::name`), which reads them
/// with [`config_as`].
pub fn spawn(test: &str, role: &str, toml: &str) -> tokio::process::Child {
    tokio::process::Command::new(std::env::current_exe().expect("the test binary's path"))
        .args(["--exact", test, "--nocapture"])
        .env(ROLE_ENV, role)
        .env(CONFIG_ENV, toml)
        .spawn()
        .expect("run the test binary again")
}
