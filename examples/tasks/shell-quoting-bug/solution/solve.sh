#!/bin/bash
set -euo pipefail
cat > /app/backup.sh <<'SH'
#!/bin/bash
# Usage: backup.sh SRC_DIR DEST_DIR
# Copies every regular file under SRC_DIR whose name ends in .txt or .md to
# DEST_DIR, keeping the relative directory layout, then writes DEST_DIR/MANIFEST
# with one "<sha256>  <relative path>" line per copied file, sorted by path.
set -euo pipefail
SRC=$1
DEST=$2

mkdir -p -- "$DEST"
DEST=$(cd -- "$DEST" && pwd)
cd -- "$SRC"
find . -type f \( -name '*.txt' -o -name '*.md' \) -print0 |
while IFS= read -r -d '' f; do
    rel=${f#./}
    mkdir -p -- "$DEST/$(dirname -- "$rel")"
    cp -- "$rel" "$DEST/$rel"
done
cd -- "$DEST"
rm -f MANIFEST
: > MANIFEST.tmp
find . -type f ! -name MANIFEST.tmp -printf '%P\0' | LC_ALL=C sort -z |
while IFS= read -r -d '' rel; do
    sum=$(sha256sum < "$rel" | cut -d' ' -f1)
    printf '%s  %s\n' "$sum" "$rel" >> MANIFEST.tmp
done
mv MANIFEST.tmp MANIFEST
echo "backed up $(wc -l < MANIFEST) files"
SH
chmod +x /app/backup.sh
rm -rf /tmp/backup-check
/app/backup.sh /app/notes /tmp/backup-check
cat /tmp/backup-check/MANIFEST
