#!/bin/bash
# Round 18: before (b373eaa) and after (HEAD) alternating, then after-only parts.
cd /tmp
for round in 1 2 3; do
  for v in before after; do
    if [ $v = before ]; then B=/work/wt-before/target/release/shardq-bench; else B=/work/main/target/release/shardq-bench; fi
    nice -n -10 $B workflows --only children --children 100 --gathers 7 --children-shards 1,4 --keyed-children --out /work/bench18/final-gather-$v-$round.json > /work/bench18/final-gather-$v-$round.txt 2>&1
  done
done
nice -n -10 /work/main/target/release/shardq-bench workflows --only sends --messages 1000 --rate 200 --out /work/bench18/final-sends.json > /work/bench18/final-sends.txt 2>&1
nice -n -10 /work/main/target/release/shardq-bench workflows --only throughput --shards 1,2,4 --workflows 10000 --out /work/bench18/final-throughput.json > /work/bench18/final-throughput.txt 2>&1
echo DONE
