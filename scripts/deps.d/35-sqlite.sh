# SQLite: engine's inode-continuity test runs Debian's sqlite3 (copied with
# its libraries into a busybox container) holding a database open across a
# rollback.
apt_need sqlite3 sqlite3
