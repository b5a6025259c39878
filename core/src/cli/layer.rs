//! The TOML config file laid under the command-line flags: one function, [`layered`], for
//! every binary, instead of merging each setting by hand.
//!
//! The file is read into the settings type itself, so it is checked key by key (an unknown
//! key is an error; a value of the wrong type names its key and line). The flags given on
//! the command line are the same type (or one with the same key names) serialized with the
//! flags that were not given left out; each one given replaces the file's key.

use std::path::{Path, PathBuf};
use std::string::{String, ToString};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A config file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not valid TOML, has an unknown key, or a value of the wrong type.
    #[error("config file {}: {}{source}", path.display(), key.as_ref().map_or(String::new(), |k| std::format!("key `{k}`: ")))]
    Parse {
        /// The file.
        path: PathBuf,
        /// The key whose value is wrong (`listen[1]` for an array element), when known.
        key: Option<String>,
        /// The parser's error (with the line and column).
        source: std::boxed::Box<toml::de::Error>,
    },
    /// The flags and the file could not be merged (a flag of a type the file's keys do not
    /// take: a bug, not a user error).
    #[error("merging the flags over the config file: {0}")]
    Merge(String),
}

/// Parses `text` (the contents of the config file `path`) as `T`.
///
/// # Errors
/// [`ConfigError::Parse`], naming the key when the error is about one.
pub fn parse_file<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T, ConfigError> {
    let parse = |source| ConfigError::Parse {
        path: path.to_path_buf(),
        key: None,
        source: std::boxed::Box::new(source),
    };
    let de = toml::Deserializer::parse(text).map_err(parse)?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let key = e.path().to_string();
        ConfigError::Parse {
            path: path.to_path_buf(),
            key: (key != ".").then_some(key),
            source: std::boxed::Box::new(e.into_inner()),
        }
    })
}

/// The texts of the config files read by [`load`], by path.
static LOADED: std::sync::Mutex<std::vec::Vec<(PathBuf, std::sync::Arc<str>)>> =
    std::sync::Mutex::new(std::vec::Vec::new());

/// Reads config file `path` now and keeps its text for every later [`layered`] call with
/// that path in this process, so that the file is read once however many settings are
/// taken from it: a file that can be read only once (a pipe such as the shell's
/// `<(printf …)`, `/dev/stdin`) then gives every caller its text instead of an empty one to
/// all but the first. A binary calls it at start with its `--config` path. A file that
/// cannot be read is not kept (the later [`layered`] call reads it and reports why).
///
/// # Errors
/// [`ConfigError::Read`]: the file cannot be read (path and OS reason).
pub fn load(path: &Path) -> Result<(), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    loaded.retain(|(p, _)| p != path);
    loaded.push((path.to_path_buf(), text.into()));
    Ok(())
}

/// The text of config file `path`: the one [`load`] kept, else read now.
fn text_of(path: &Path) -> Result<std::sync::Arc<str>, ConfigError> {
    let loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, text)) = loaded.iter().find(|(p, _)| p == path) {
        return Ok(text.clone());
    }
    drop(loaded);
    std::fs::read_to_string(path)
        .map(Into::into)
        .map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })
}

/// The settings of config file `file` (if any) with the flags of `flags` over them: every
/// key that `flags` serializes (leave the flags that were not given out, e.g. with
/// `skip_serializing_if`) replaces the file's. Without a file, the flags alone. The file's
/// text is the one [`load`] kept for its path, else it is read now.
///
/// # Errors
/// The file cannot be read or parsed ([`ConfigError::Read`], [`ConfigError::Parse`]).
pub fn layered<T, F>(file: Option<&Path>, flags: &F) -> Result<T, ConfigError>
where
    T: Serialize + DeserializeOwned,
    F: Serialize,
{
    let merge = |e: &dyn std::fmt::Display| ConfigError::Merge(e.to_string());
    let mut table = match file {
        Some(path) => {
            let text = text_of(path)?;
            let from_file: T = parse_file(path, &text)?;
            toml::Table::try_from(&from_file).map_err(|e| merge(&e))?
        }
        None => toml::Table::new(),
    };
    for (key, value) in toml::Table::try_from(flags).map_err(|e| merge(&e))? {
        table.insert(key, value);
    }
    table.try_into().map_err(|e: toml::de::Error| merge(&e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::units::ByteSize;
    use serde::Deserialize;
    use std::vec::Vec;

    #[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "kebab-case")]
    struct Settings {
        #[serde(skip_serializing_if = "Option::is_none")]
        linger_ms: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        buffer_bytes: Option<ByteSize>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        listen: Vec<String>,
    }

    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, text).unwrap();
        (dir, p)
    }

    #[test]
    fn a_flag_given_replaces_the_files_key_and_the_others_stay() {
        let (_d, p) = file("linger-ms = 5\nbuffer-bytes = \"128K\"\nlisten = [\"tcp://:1\"]\n");
        let flags = Settings {
            linger_ms: Some(7),
            ..Settings::default()
        };
        let s: Settings = layered(Some(&p), &flags).unwrap();
        assert_eq!(s.linger_ms, Some(7));
        assert_eq!(s.buffer_bytes, Some(ByteSize(128 << 10)));
        assert_eq!(s.listen, ["tcp://:1"]);
        let flags = Settings {
            listen: std::vec!["unix:///x".into()],
            ..Settings::default()
        };
        let s: Settings = layered(Some(&p), &flags).unwrap();
        assert_eq!(
            (s.linger_ms, s.listen.as_slice()),
            (Some(5), &["unix:///x".to_string()][..])
        );
        let s: Settings = layered(None, &flags).unwrap();
        assert_eq!(s, flags);
    }

    #[test]
    fn errors_name_the_file_and_the_key() {
        let (_d, p) = file("linger-ms = \"soon\"\n");
        let e = layered::<Settings, _>(Some(&p), &Settings::default()).unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(&e, ConfigError::Parse { key: Some(k), .. } if k == "linger-ms"),
            "{text}"
        );
        assert!(
            text.contains("c.toml") && text.contains("key `linger-ms`"),
            "{text}"
        );
        let (_d, p) = file("listen = [\"a\", 3]\n");
        let e = layered::<Settings, _>(Some(&p), &Settings::default()).unwrap_err();
        assert!(e.to_string().contains("key `listen[1]`"), "{e}");
        let (_d, p) = file("bogus = 1\n");
        let e = layered::<Settings, _>(Some(&p), &Settings::default()).unwrap_err();
        assert!(e.to_string().contains("unknown field `bogus`"), "{e}");
        let (_d, p) = file("linger-ms = \n");
        assert!(matches!(
            layered::<Settings, _>(Some(&p), &Settings::default()),
            Err(ConfigError::Parse { key: None, .. })
        ));
        let missing = p.with_file_name("missing.toml");
        assert!(matches!(
            layered::<Settings, _>(Some(&missing), &Settings::default()),
            Err(ConfigError::Read { .. })
        ));
    }
}
