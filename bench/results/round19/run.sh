#!/bin/bash
cd /work/main
for round in 1 2 small; do
  for which in before after; do
    if [ $which = before ]; then bin=/work/wt-before/target/release/shardq-bench; else bin=target/release/shardq-bench; fi
    extra=""; [ $round = small ] && extra="--small-buffers"
    echo "=== $which round $round $(date)"
    nice -n -10 timeout 900 $bin workflows --only frozen-sends --rate 100 --freeze-s 30 $extra --out /work/fs/$which-$round.json 2>/work/fs/$which-$round.err | grep -v "INFO\|WARN"
  done
done
echo "=== done $(date)"
