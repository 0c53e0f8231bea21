#!/usr/bin/env bash
# On-policy distillation on reverse_text, CPU: a well-trained teacher, a weak student, then the student distilled
# from the teacher; the held-out table of all three. Timing per phase goes to runs/distill-times.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf runs/distill-teacher runs/distill-student runs/distill-student-rl runs/distill-teacher-eval
t() { local name=$1; shift; local t0=$SECONDS; "$@"; echo "$name $((SECONDS - t0)) s" >> runs/distill-times.txt; }
mkdir -p runs && : > runs/distill-times.txt
t init thermik model init --preset qwen2-1m --out runs/reverse-init --overwrite
t data thermik synthesize --env reverse_text --n 4000 --out runs/reverse-data
t teacher_sft thermik sft @ examples/distillation/teacher_sft.toml
t student_sft thermik sft @ examples/distillation/student_sft.toml
t teacher_eval thermik eval @ examples/distillation/distill.toml --name distill-teacher-eval \
    --model.path runs/distill-teacher/model
t distill thermik rl @ examples/distillation/distill.toml
cat runs/distill-times.txt
