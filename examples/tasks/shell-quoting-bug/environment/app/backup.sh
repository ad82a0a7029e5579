#!/bin/bash
# Usage: backup.sh SRC_DIR DEST_DIR
# Copies every regular file under SRC_DIR whose name ends in .txt or .md to
# DEST_DIR, keeping the relative directory layout, then writes DEST_DIR/MANIFEST
# with one "<sha256>  <relative path>" line per copied file, sorted by path.
SRC=$1
DEST=$2

mkdir -p $DEST
cd $SRC
for f in $(find . -type f -name "*.txt" -o -name "*.md"); do
    rel=${f#./}
    mkdir -p $DEST/$(dirname $rel)
    cp $rel $DEST/$rel
done
cd $DEST
rm -f MANIFEST
for f in $(find . -type f | sort); do
    rel=${f#./}
    echo "$(sha256sum $rel | cut -d' ' -f1)  $rel" >> MANIFEST
done
echo "backed up $(wc -l < MANIFEST) files"
