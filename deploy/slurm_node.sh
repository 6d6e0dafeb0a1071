#!/bin/bash
# One node of deploy/slurm_train_with_evald.sbatch (srun runs it once per node; see that file).
set -euo pipefail
: "${SLURM_NODEID:?run by srun inside the sbatch job}" "${RUN:?}" "${MASTER_ADDR:?}" "${MASTER_PORT:?}"

WORKERS=$((DEVICES_PER_NODE * SLURM_NNODES - 1))          # every device of every node, but evald's
LOCAL_WORKERS=$DEVICES_PER_NODE
EVALD_PID=
if [[ $SLURM_NODEID == 0 ]]; then
    LOCAL_WORKERS=$((DEVICES_PER_NODE - 1))               # msrun gives its workers devices 0..LOCAL_WORKERS-1
    # evald first, on the last device: it learns the run from the trainer's (authenticated) announcement.
    EVALD_SERVER_KEY=$RUN/keys/evald-host/evald.key_secret EVALD_ALLOWED_KEYS=$RUN/keys/evald-host/allowed \
        evald --device "$LOCAL_WORKERS" --ckpt-dir "$RUN/ckpt" $EVALD_ARGS > "$RUN/evald.log" 2>&1 &
    EVALD_PID=$!
fi

# Ranks are assigned by msrun (nodes run different numbers of workers, so no --node_rank).
export EVALD_CLIENT_KEY=$RUN/keys/trainer-host/trainer.key_secret
export EVALD_SERVER_PUBLIC_KEY=$RUN/keys/trainer-host/evald.key
status=0
msrun --worker_num="$WORKERS" --local_worker_num="$LOCAL_WORKERS" --master_addr="$MASTER_ADDR" \
    --master_port="$MASTER_PORT" --log_dir="$RUN/msrun/node$SLURM_NODEID" --join=True \
    "$TRAIN_SCRIPT" --ckpt-dir "$RUN/ckpt" $TRAIN_ARGS || status=$?

if [[ -n $EVALD_PID ]]; then
    # After a normal end the trainer's RUN_END.json makes evald evaluate the final checkpoint and
    # exit 0. If training failed there is no run end: stop evald (it finishes the evaluation under way).
    if [[ $status != 0 ]]; then kill -TERM "$EVALD_PID"; fi
    evald_status=0
    wait "$EVALD_PID" || evald_status=$?
    if [[ $status == 0 ]]; then status=$evald_status; fi
fi
exit "$status"
