use super::*;
use std::os::unix::fs::PermissionsExt;

#[test]
fn walking_through_a_symlink_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("real")).unwrap();
    std::os::unix::fs::symlink(outside.path(), tmp.path().join("link")).unwrap();
    let root = TreeDir::open(tmp.path()).unwrap();
    assert!(root.walk(Path::new("real")).is_ok());
    let err = root.walk(Path::new("link")).unwrap_err();
    assert!(is_symlink_refusal(&err), "{err}");
    let err = root.make_dirs(Path::new("link/x"), 0o755).unwrap_err();
    assert!(is_symlink_refusal(&err) || err.raw_os_error() == Some(Errno::ENOTDIR as i32));
    assert!(root.walk(Path::new("../")).is_err());
    assert!(!outside.path().join("x").exists());
}

#[test]
fn set_mode_of_a_symlink_never_reaches_its_target() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("target");
    std::fs::write(&target, b"secret").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
    let tree = tmp.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    std::os::unix::fs::symlink(&target, tree.join("x")).unwrap();
    let root = TreeDir::open(&tree).unwrap();
    assert!(root.set_mode_of(OsStr::new("x"), 0o6777).is_err());
    assert!(root.walk(Path::new("x")).is_err());
    let mode = std::fs::metadata(&target).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o600);
}

#[test]
fn remove_takes_read_only_trees_and_never_follows() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("keep"), b"x").unwrap();
    let tree = tmp.path().join("tree");
    std::fs::create_dir_all(tree.join("a/b")).unwrap();
    std::fs::write(tree.join("a/b/f"), b"x").unwrap();
    std::os::unix::fs::symlink(&outside, tree.join("a/out")).unwrap();
    std::fs::set_permissions(tree.join("a/b"), std::fs::Permissions::from_mode(0o500)).unwrap();
    std::fs::set_permissions(tree.join("a"), std::fs::Permissions::from_mode(0o000)).unwrap();
    remove_tree(&tree).unwrap();
    assert!(!tree.exists());
    assert!(outside.join("keep").exists());
    remove_tree(&tree).unwrap();
}

#[test]
fn a_tree_deeper_than_the_descriptor_budget_is_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let tree = tmp.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    // 3 * MAX_DEPTH levels, made by descriptor (the path is longer than PATH_MAX).
    let mut at = TreeDir::open(&tree).unwrap();
    for _ in 0..3 * MAX_DEPTH {
        at.mkdir(OsStr::new("deeper-than-you-would-think"), 0o755)
            .unwrap();
        at.create_file(OsStr::new("f"), 0o600).unwrap();
        at = at.dir(OsStr::new("deeper-than-you-would-think")).unwrap();
    }
    drop(at);
    remove_tree(&tree).unwrap();
    assert!(!tree.exists());
}

#[test]
fn names_must_be_plain() {
    let tmp = tempfile::tempdir().unwrap();
    let root = TreeDir::open(tmp.path()).unwrap();
    for bad in ["", ".", "..", "a/b"] {
        assert!(root.mkdir(OsStr::new(bad), 0o755).is_err(), "{bad:?}");
    }
}
