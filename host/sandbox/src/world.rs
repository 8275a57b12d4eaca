//! Which world a component implements, and whether this host speaks its WIT version.

use std::fmt;

/// The WIT package this host implements.
pub const WIT_PACKAGE: &str = "wirl:rl";
/// The first version, frozen (`wit/`). Components built against any `0.1.x` load.
pub const WIT_VERSION: &str = "0.1.0";
/// The versions this host speaks, each in its own directory (`wit/`, `wit/0.2.0/`): a
/// component is linked against the one it was built for. Other versions are refused.
pub const WIT_VERSIONS: [&str; 2] = [WIT_VERSION, "0.2.0"];

/// The worlds of `wirl:rl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum World {
    RewardPlugin,
    EnvironmentPlugin,
    AgentPlugin,
    CodeRunnerPlugin,
    GraderPlugin,
}

impl World {
    pub fn name(self) -> &'static str {
        match self {
            World::RewardPlugin => "reward-plugin",
            World::EnvironmentPlugin => "environment-plugin",
            World::AgentPlugin => "agent-plugin",
            World::CodeRunnerPlugin => "code-runner-plugin",
            World::GraderPlugin => "grader-plugin",
        }
    }

    /// Whether this world exports `wirl:rl/reward` (it can score completions).
    pub fn scores(self) -> bool {
        matches!(self, World::RewardPlugin | World::GraderPlugin)
    }
}

impl fmt::Display for World {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An interface name of a component import or export, split: `wirl:rl/reward@0.1.0`.
#[derive(Debug, PartialEq)]
pub(crate) struct InterfaceName<'a> {
    pub package: &'a str,
    pub interface: &'a str,
    pub version: Option<&'a str>,
}

pub(crate) fn parse_interface_name(name: &str) -> Option<InterfaceName<'_>> {
    let (path, version) = match name.split_once('@') {
        Some((path, version)) => (path, Some(version)),
        None => (name, None),
    };
    let (package, interface) = path.split_once('/')?;
    Some(InterfaceName { package, interface, version })
}

/// Which of [`WIT_VERSIONS`] a component built against `version` of `wirl:rl` is linked
/// against: the one of the same major version, or for 0.x the same minor (semver's rule for
/// pre-1.0 versions). `None`: this host does not speak it.
pub(crate) fn compatible_version(version: &str) -> Option<&'static str> {
    let parse = |v: &str| -> Option<(u64, u64)> {
        let mut parts = v.split('.');
        Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
    };
    let (major, minor) = parse(version)?;
    WIT_VERSIONS.into_iter().find(|ours| {
        parse(ours).is_some_and(|(our_major, our_minor)| major == our_major && (major != 0 || minor == our_minor))
    })
}

/// The versions this host speaks, for messages: `wirl:rl@0.1.0 and @0.2.0`.
fn spoken() -> String {
    format!("{WIT_PACKAGE}@{}", WIT_VERSIONS.join(" and @"))
}

/// Decide the world from a component's exports and imports (as interface names).
pub(crate) fn detect_world(exports: &[String], imports: &[String]) -> Result<World, String> {
    let mut ours = Vec::new();
    let mut linked = None;
    for name in exports {
        if let Some(parsed) = parse_interface_name(name)
            && parsed.package == WIT_PACKAGE
        {
            let version = parsed.version.unwrap_or("(unversioned)");
            let Some(ours_version) = compatible_version(version) else {
                return Err(format!(
                    "it was built for {WIT_PACKAGE}@{version}, but this wirl speaks {}; rebuild it against \
                     the wit/ directory of this wirl version",
                    spoken()
                ));
            };
            linked = Some(ours_version);
            ours.push(parsed.interface);
        }
    }
    let imports_runner = imports.iter().any(|name| {
        parse_interface_name(name).is_some_and(|p| p.package == WIT_PACKAGE && p.interface == "code-runner")
    });
    let world = match ours.as_slice() {
        ["reward"] if imports_runner => World::GraderPlugin,
        ["reward"] => World::RewardPlugin,
        ["environment"] => World::EnvironmentPlugin,
        ["agent"] => World::AgentPlugin,
        ["code-runner"] => World::CodeRunnerPlugin,
        [] => {
            let shown = if exports.is_empty() { "nothing".to_string() } else { exports.join(", ") };
            return Err(format!(
                "it exports no {WIT_PACKAGE} interface (it exports {shown}); a wirl plugin exports \
                 one of reward, environment, agent or code-runner from {}",
                spoken()
            ));
        }
        several => {
            return Err(format!(
                "it exports several {WIT_PACKAGE} interfaces ({}); a plugin implements exactly one world",
                several.join(", ")
            ));
        }
    };
    if linked != Some(WIT_VERSION) && !matches!(world, World::RewardPlugin | World::EnvironmentPlugin) {
        return Err(format!(
            "it is a {world} of {WIT_PACKAGE}@{}, which holds only the reward-plugin and environment-plugin \
             worlds so far: build it against {WIT_PACKAGE}@{WIT_VERSION} (wit/)",
            linked.unwrap_or("?")
        ));
    }
    Ok(world)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn worlds_are_told_apart_by_exports_and_imports() {
        let reward = names(&["wirl:rl/reward@0.1.0"]);
        assert_eq!(detect_world(&reward, &[]), Ok(World::RewardPlugin));
        assert_eq!(detect_world(&reward, &names(&["wirl:rl/code-runner@0.1.0"])), Ok(World::GraderPlugin));
        assert_eq!(detect_world(&names(&["wirl:rl/environment@0.1.3"]), &[]), Ok(World::EnvironmentPlugin));
        assert!(detect_world(&names(&["wasi:cli/run@0.2.0"]), &[]).unwrap_err().contains("no wirl:rl"));
    }

    #[test]
    fn each_version_links_against_its_own_and_others_are_refused() {
        assert_eq!(compatible_version("0.1.0"), Some("0.1.0"));
        assert_eq!(compatible_version("0.1.9"), Some("0.1.0"));
        assert_eq!(compatible_version("0.2.3"), Some("0.2.0"));
        for other in ["0.3.0", "1.0.0", "x"] {
            assert_eq!(compatible_version(other), None, "{other}");
        }
        let err = detect_world(&names(&["wirl:rl/reward@2.0.0"]), &[]).unwrap_err();
        assert!(err.contains("wirl:rl@2.0.0") && err.contains("@0.1.0 and @0.2.0") && err.contains("rebuild"), "{err}");
        assert_eq!(detect_world(&names(&["wirl:rl/reward@0.2.0"]), &[]), Ok(World::RewardPlugin));
        assert_eq!(detect_world(&names(&["wirl:rl/environment@0.2.0"]), &[]), Ok(World::EnvironmentPlugin));
        let err = detect_world(&names(&["wirl:rl/agent@0.2.0"]), &[]).unwrap_err();
        assert!(err.contains("only the reward-plugin and environment-plugin worlds"), "{err}");
    }
}
