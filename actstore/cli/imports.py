"""`actstore import`: activations made elsewhere become a run (docs/import.md)."""

from __future__ import annotations

from actstore.cli.common import SERVER_PATH_HELP, add_option, connect, server_path
from actstore.options import IMPORTS

DESCRIPTION = """\
Import activations computed elsewhere as a run of a registered model on a registered dataset.
The files are read on the server (a path on its disk, resolved there, except that a relative
path that exists where the command runs is sent absolute; with --auth an admin's right, as for
register-model from a path). They are checked (float values, layers 0..L of the model, its width,
one row per dataset sample in the dataset's order) and written through the same checksummed
layout a capture writes, so every query works on the run. The same files imported again are a
cache hit; an interrupted import resumes its missing shards when submitted again.

Formats (--format, detected when omitted):
  arrays    a folder of layer_<k>.npy or layer_<k>.safetensors (one (samples, width) array per
            layer k = 0..L), or one .safetensors file of tensors layer.0 .. layer.L; an optional
            sample_ids.json (a JSON list) beside them must equal the dataset's ids in order
  vllm      the <sample id>.safetensors files vLLM's extract_hidden_states writes (hidden_states
            (tokens, L+1, width), token_ids), extracted with layer ids 0..num_hidden_layers
  saelens   a SAELens cached-activations dataset (save_to_disk folder): columns
            blocks.<i>.hook_resid_pre (layer i) / blocks.<i>.hook_resid_post (layer i+1)

vllm and saelens hold every token: --pooling cls|last|mean pools them, tokens keeps them all.

  actstore import ./acts --model gpt2-tiny --dataset reviews --pooling mean
"""


def cmd_import(args) -> int:
    with connect(args) as client:
        result = client.import_activations(args.path, model=args.model, dataset=args.dataset, format=args.format,
                                           pooling=args.pooling, dtype=args.dtype, progress=not args.quiet)
    how = "cache hit: already stored" if result.cache_hit else ("joined a running job" if result.job.joined
                                                              else "imported")
    print(f"run {result.run_key}  ({how})")
    return 0


def add_commands(command) -> None:
    p = command("import", cmd_import, "import activations made elsewhere (npy/safetensors, vLLM, SAELens) as a run",
                DESCRIPTION)
    p.add_argument("path", type=server_path,
                   help=f"the activations: a folder or file on the server's file system {SERVER_PATH_HELP}")
    p.add_argument("--model", required=True, help="the registered model they are of (alias or digest)")
    p.add_argument("--dataset", required=True, help="the registered dataset whose samples they are")
    add_option(p, IMPORTS, "format")
    add_option(p, IMPORTS, "pooling")
    add_option(p, IMPORTS, "dtype")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
