"""Retrieval-guided specificity (specificity paper §3.2-3.3): the CLIP text path from one-hot
tokens, the straight-through gradient, the objective, validation mean rank, and the
contrastive-image (top-1%) neighbour table."""

import copy
import math

import numpy as np
import open_clip
import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import CLIP_TESTS_CAPTIONER, CLIP_TESTS_TRAIN, ROOT, shrink_runs, tiny_captioner
from train_job import fit, kill_after, run_of

import distinctcap.clip.weights  # registers the tiny `shapes-vit-tiny` architecture
import distinctcap.train.clip  # save_weights (not imported by anything else here)
from distinctcap.captioner.search import greedy
from distinctcap.clip.text import ClipTextEncoder
from distinctcap.config.check import load_schema, validate
from distinctcap.config.rungraph import effective_run_config
from distinctcap.core import work
from distinctcap.core.errors import DistinctcapError
from distinctcap.data.tokenizer import EOS, PAD, CaptionTokenizer
from distinctcap.features.batches import CaptionData
from distinctcap.features.neighbours import (
    NeighbourTable,
    neighbour_count,
    read_neighbours,
    table_path,
    top_neighbours,
    write_neighbours,
)
from distinctcap.features.read import ImageFeatures, RowFile
from distinctcap.methods import METHODS
from distinctcap.methods.base import TrainContext
from distinctcap.methods.clipval import clip_val_ranks
from distinctcap.methods.losses import specificity_loss
from distinctcap.methods.specificity import (
    Specificity,
    caption_ids_tensor,
    generate_ids,
    val_mean_rank,
)
from distinctcap.scores.ranks import retrieval_ranks
from distinctcap.train.data import RunData

pytestmark = pytest.mark.usefixtures("one_thread")

ARCH = "shapes-vit-tiny"
TEXTS = [
    "a red circle left of a blue square",
    "a small green triangle",
    "some shapes on a grey background",
    "a large yellow star above a purple circle",
    "two blue squares",
    "a picture of some shapes",
]


@pytest.fixture(scope="module")
def clip():
    torch.manual_seed(0)
    return open_clip.create_model(ARCH).eval()  # random weights: no download


@pytest.fixture(scope="module")
def tok():
    return CaptionTokenizer.fit(TEXTS)


def world(clip, tok, n_images=6, seed=0):
    """Images whose CLIP embedding is the text embedding of one caption each, so the
    specificity loss has a clear optimum; grid features are random."""
    with torch.no_grad():
        raw = clip.encode_text(open_clip.get_tokenizer(ARCH)(TEXTS[:n_images]))
    g = torch.Generator().manual_seed(seed)
    grid = torch.randn(n_images, 4, 16, generator=g).half()
    ids = np.arange(100, 100 + n_images)
    feats = ImageFeatures(ids, F.normalize(raw, dim=-1), grid, raw.norm(dim=-1))
    data = CaptionData(
        feats, np.arange(n_images), ids, [tok.encode(t) for t in TEXTS[:n_images]], max_len=12
    )
    return feats, data


def clip_embed_dim() -> int:
    """Embedding size of the registered tiny CLIP (its config may change with tuning)."""
    import open_clip

    return open_clip.get_model_config("shapes-vit-tiny")["embed_dim"]


def captioner(tok, seed=0):
    return tiny_captioner(
        tok.vocab_size, 16, clip_embed_dim(), seed, width=32, dec_layers=1, ffn=64, max_len=12
    )


def table_of(feats, k=2):
    ids = feats.image_ids
    return NeighbourTable(ids, ids[top_neighbours(feats.pooled, k).numpy()], ids)


def seqs_of(tok, texts, eos=True):
    rows = [tok.encode(t) + ([EOS] if eos else []) for t in texts]
    out = torch.full((len(rows), max(map(len, rows))), PAD)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r)
    return out


# ------------------------------------------------------------------ the CLIP text path


def test_clip_tokens_match_open_clip_tokenizer(clip, tok):
    enc = ClipTextEncoder(clip, tok.clip_ids)
    expected = open_clip.get_tokenizer(ARCH)(TEXTS)
    assert torch.equal(enc.clip_tokens(seqs_of(tok, TEXTS)), expected)
    # A caption that hit max_len without eos still ends with CLIP's eot.
    assert torch.equal(enc.clip_tokens(seqs_of(tok, TEXTS, eos=False)), expected)
    # Longer than the context (32): open_clip keeps the first 30 tokens and ends with eot.
    long = " ".join(TEXTS * 2)
    assert len(tok.encode(long)) > enc.context_length
    assert torch.equal(enc.clip_tokens(seqs_of(tok, [long])), open_clip.get_tokenizer(ARCH)([long]))


def test_text_encoder_equals_encode_text(clip, tok):
    enc = ClipTextEncoder(clip, tok.clip_ids)
    seqs = seqs_of(tok, TEXTS)
    with torch.no_grad():
        expected = clip.encode_text(open_clip.get_tokenizer(ARCH)(TEXTS), normalize=True)
        probs = torch.rand(*seqs.shape, tok.vocab_size).softmax(-1)
        assert torch.allclose(enc(seqs), expected, atol=1e-5)
        assert torch.allclose(enc(seqs, probs), expected, atol=1e-5)  # forward uses hard ids


def test_bidirectional_tower_uses_the_full_context(clip, tok):
    """Only under a causal mask may the positions after eot be cut; without a mask they count."""
    bidirectional = copy.deepcopy(clip)
    bidirectional.attn_mask = None
    enc = ClipTextEncoder(bidirectional, tok.clip_ids)
    assert ClipTextEncoder(clip, tok.clip_ids).causal and not enc.causal
    with torch.no_grad():
        expected = bidirectional.encode_text(open_clip.get_tokenizer(ARCH)(TEXTS), normalize=True)
        assert torch.allclose(enc(seqs_of(tok, TEXTS)), expected, atol=1e-5)


def test_straight_through_gradient_is_the_one_hot_gradient(clip, tok):
    """d loss / d probs[b, t, v] = d loss / d onehot_clip[b, t + 1, clip_ids[v]] at caption
    positions (incl. eos), 0 at pad positions: the captioner-vocabulary shortcut computes the
    same thing as a one-hot over CLIP's 49408 tokens times the embedding matrix."""
    enc = ClipTextEncoder(clip, tok.clip_ids)
    seqs = seqs_of(tok, TEXTS[:3])
    w = torch.randn(clip_embed_dim(), generator=torch.Generator().manual_seed(1))
    probs = torch.rand(*seqs.shape, tok.vocab_size).softmax(-1).requires_grad_()
    (enc(seqs, probs) @ w).sum().backward()

    tokens = enc.clip_tokens(seqs)
    onehot = torch.nn.functional.one_hot(tokens, clip.vocab_size).float().requires_grad_()
    x = onehot @ clip.token_embedding.weight
    (enc.forward_embeddings(x, tokens) @ w).sum().backward()

    clip_ids = torch.tensor(tok.clip_ids)
    expected = onehot.grad[:, 1 : 1 + seqs.shape[1]][..., clip_ids]  # (B, T, V_cap)
    expected = expected * (seqs != PAD)[..., None]
    assert probs.grad.abs().sum() > 0
    assert torch.allclose(probs.grad, expected, atol=1e-6)


# ------------------------------------------------------------------ the objective


def make_objective(clip, tok, data, feats, **run):
    ctx = TrainContext(torch.device("cpu"), data, {}, tok)
    return Specificity(run_of({"seed": 0, **run}), ctx, clip=clip, neighbours=table_of(feats))


def test_registered_method():
    assert METHODS["specificity"] is Specificity


def test_argmax_generation_is_greedy_decoding(tok, clip):
    feats, data = world(clip, tok)
    model = captioner(tok)
    seqs, noise = generate_ids(model, feats.grid, feats.pooled)
    expected = [c.tokens for c in greedy(model, feats.grid, feats.pooled)]
    assert noise is None
    assert torch.equal(seqs, caption_ids_tensor(expected, seqs.device)[:, : seqs.shape[1]])


def test_gradient_reaches_captioner_parameters(clip, tok):
    feats, data = world(clip, tok)
    model = captioner(tok)
    model.train()
    loss, extras = make_objective(clip, tok, data, feats, loss="cos").loss(
        model, data.batch(torch.arange(6)), 0, 10
    )
    loss.backward()
    for name in (
        "decoder.0.self_attn.q.weight",
        "decoder.0.cross_attn.kv.weight",
        "decoder.0.mlp.net.0.weight",
        "tok_emb.weight",
        "encoder.0.attn.q.weight",
    ):
        grad = dict(model.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name
    assert set(extras) == {"specificity", "cos_true", "gen_len"}


def test_training_lowers_the_loss(clip, tok):
    """A few steps of straight-through training make the greedy captions closer to their
    images in CLIP space (eq. 3)."""
    feats, data = world(clip, tok)
    model = captioner(tok)
    enc = ClipTextEncoder(clip, tok.clip_ids)
    objective = make_objective(clip, tok, data, feats, loss="cos")
    batch = data.batch(torch.arange(6))

    def greedy_loss():
        seqs, _ = generate_ids(model, feats.grid, feats.pooled)
        with torch.no_grad():
            return float(specificity_loss(enc(seqs), feats.pooled, kind="cos"))

    before = greedy_loss()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(40):
        loss, _ = objective.loss(model, batch, step, 40)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert greedy_loss() < before - 0.05


@pytest.mark.parametrize("kind", ["dp", "cos", "cdp", "ccos"])
@pytest.mark.parametrize("sampling", ["argmax", "gumbel"])
def test_each_loss_kind_builds(clip, tok, kind, sampling):
    feats, data = world(clip, tok)
    model = captioner(tok)
    objective = make_objective(
        clip, tok, data, feats, loss=kind, sampling=sampling, gumbel_temperature=0.5, mle_weight=0.1
    )
    loss, extras = objective.loss(model, data.batch(torch.arange(6)), 3, 10)
    loss.backward()
    assert math.isfinite(float(loss.detach())) and "mle" in extras
    assert ("cos_contrast" in extras) == (kind in ("cdp", "ccos"))
    if kind in ("cdp", "ccos"):
        assert float(loss.detach()) - 0.1 * float(extras["mle"]) >= -1e-6  # hinges are >= 0
    expected = 0.1 * float(extras["mle"]) + 0.9 * float(extras["specificity"])  # eq. 4 mixing
    assert float(loss.detach()) == pytest.approx(expected, abs=1e-5)


def test_the_four_kinds_give_four_different_losses(clip, tok):
    """Table 1's four rows are four objectives: dp/cdp on CLIP's unnormalised projections,
    cos/ccos on unit vectors (eq. 2-5), so one batch gives four different losses."""
    feats, data = world(clip, tok)
    model, batch = captioner(tok), data.batch(torch.arange(6))
    losses = {}
    for kind in ("dp", "cos", "cdp", "ccos"):
        objective = make_objective(clip, tok, data, feats, loss=kind)
        losses[kind] = float(objective.loss(model, batch, 0, 1)[0].detach())
    assert len({round(v, 6) for v in losses.values()}) == 4, losses
    seqs, _ = generate_ids(model, batch.grid, batch.pooled)
    with torch.no_grad():
        text = ClipTextEncoder(clip, tok.clip_ids)(seqs, normalize=False)
    image = feats.unnormalised(torch.arange(6))
    assert losses["dp"] == pytest.approx(-float((text * image).sum(-1).mean()), rel=1e-5)
    assert losses["cos"] == pytest.approx(-float(F.cosine_similarity(text, image).mean()), rel=1e-5)


def test_dp_needs_the_stored_norms(clip, tok):
    feats, data = world(clip, tok)
    bare = ImageFeatures(feats.image_ids, feats.pooled, feats.grid)
    data = CaptionData(bare, np.arange(6), bare.image_ids, [tok.encode(t) for t in TEXTS], 12)
    objective = make_objective(clip, tok, data, bare, loss="dp")
    with pytest.raises(DistinctcapError, match="pooled_norm"):
        objective.loss(captioner(tok), data.batch(torch.arange(6)), 0, 1)


def test_duplicate_images_decoded_once_give_the_per_caption_loss(clip, tok):
    """Several captions of one image in a batch: argmax decodes each image once, and the loss
    is still the mean over the batch's captions."""
    feats, _ = world(clip, tok)
    image_ids = feats.image_ids[[0, 0, 1, 2, 2, 2]]
    data = CaptionData(feats, np.arange(6), image_ids, [tok.encode(t) for t in TEXTS], 12)
    model = captioner(tok)
    batch = data.batch(torch.arange(6))
    with work.counting() as counted:
        loss, _ = make_objective(clip, tok, data, feats, loss="cos").loss(model, batch, 0, 1)
    assert counted == {"decoded": 3}  # the work record counts the 3 images' captions once
    seqs, _ = generate_ids(model, batch.grid, batch.pooled)
    with torch.no_grad():
        text = ClipTextEncoder(clip, tok.clip_ids)(seqs)
    assert float(loss.detach()) == pytest.approx(
        float(specificity_loss(text, batch.pooled, kind="cos")), abs=1e-6
    )


def test_draws_are_reproducible_per_step(clip, tok):
    feats, data = world(clip, tok)
    model = captioner(tok)
    batch = data.batch(torch.arange(6))
    first = make_objective(clip, tok, data, feats, loss="ccos", sampling="gumbel")
    second = make_objective(clip, tok, data, feats, loss="ccos", sampling="gumbel")
    a = [float(first.loss(model, batch, s, 10)[0].detach()) for s in (0, 1, 2)]
    b = [float(second.loss(model, batch, s, 10)[0].detach()) for s in (0, 1, 2)]
    assert a == b
    assert len({*a}) > 1  # another step, another draw


def test_bad_options_and_missing_table(clip, tok):
    feats, data = world(clip, tok)
    ctx = TrainContext(torch.device("cpu"), data, {}, tok)
    with pytest.raises(DistinctcapError, match="loss"):
        Specificity(run_of({"loss": "l2"}), ctx, clip=clip)
    with pytest.raises(DistinctcapError, match="mle_weight"):
        Specificity(run_of({"mle_weight": 2.0}), ctx, clip=clip)
    with pytest.raises(DistinctcapError, match="sampling"):
        Specificity(run_of({"sampling": "beam"}), ctx, clip=clip)
    with pytest.raises(DistinctcapError, match="contrastive-image table"):
        Specificity(run_of({"loss": "cdp"}), ctx, clip=clip)
    Specificity(run_of({"loss": "dp"}), ctx, clip=clip)  # non-contrastive kinds need no table


def test_val_mean_rank(clip, tok):
    feats, data = world(clip, tok)
    model = captioner(tok)
    rank = val_mean_rank(model, data, ClipTextEncoder(clip, tok.clip_ids))
    caps = greedy(model, feats.grid, feats.pooled)
    clip_tokens = torch.zeros(6, 32, dtype=torch.long)  # [sot] + caption + [eot], pad 0
    for i, c in enumerate(caps):
        row = [49406, *tok.to_clip(c.tokens), 49407]
        clip_tokens[i, : len(row)] = torch.tensor(row)
    with torch.no_grad():
        text = clip.encode_text(clip_tokens, normalize=True)
    expected = retrieval_ranks(text, feats.pooled, np.arange(6)).mean()
    assert 1 <= rank <= 6 and rank == pytest.approx(expected)
    assert 1 <= val_mean_rank(model, data, ClipTextEncoder(clip, tok.clip_ids), images=3) <= 3
    objective = make_objective(clip, tok, data, feats, loss="cos", rank_images=3)
    assert objective.val_metrics == {"mean_rank": "min"}
    assert objective.val_metric("mean_rank", model, data) == val_mean_rank(
        model, data, ClipTextEncoder(clip, tok.clip_ids), images=3
    )
    with pytest.raises(DistinctcapError, match="mean_rank"):
        objective.val_metric("cider", model, data)


def test_smile_selects_on_validation_clip_self_retrieval(clip, tok):
    """SMILE §3.3: R@1 of the greedy captions' CLIP retrieval among the validation images."""
    from distinctcap.methods.smile import SMILE

    feats, data = world(clip, tok)
    model = captioner(tok)
    ctx = TrainContext(torch.device("cpu"), data, {}, tok)
    ctx.clip = clip
    objective = SMILE(run_of({"seed": 0}), ctx)
    assert objective.val_metrics == {"clip_self_retrieval": "max"}
    ranks = clip_val_ranks(model, data, ClipTextEncoder(clip, tok.clip_ids))
    assert objective.val_metric("clip_self_retrieval", model, data) == np.mean(ranks == 1)
    assert val_mean_rank(model, data, ClipTextEncoder(clip, tok.clip_ids)) == ranks.mean()
    with pytest.raises(DistinctcapError, match="clip_self_retrieval"):
        objective.val_metric("mean_rank", model, data)


# ------------------------------------------------------------------ the neighbour table

# Unit vectors at these angles (degrees); all pairwise angular distances differ, so the
# order of neighbours (most similar = smallest angle first) is known by hand.
ANGLES = [0, 10, 25, 90, 100, 195]
EXPECTED = [
    [1, 2, 3, 4, 5],  # 0:   10, 25, 90, 100, 165
    [0, 2, 3, 4, 5],  # 10:  10, 15, 80, 90, 175
    [1, 0, 3, 4, 5],  # 25:  15, 25, 65, 75, 170
    [4, 2, 1, 0, 5],  # 90:  10, 65, 80, 90, 105
    [3, 2, 1, 5, 0],  # 100: 10, 75, 90, 95, 100
    [4, 3, 0, 2, 1],  # 195: 95, 105, 165, 170, 175
]


def circle():
    a = torch.tensor(ANGLES, dtype=torch.float64).deg2rad()
    return torch.stack([a.cos(), a.sin()], dim=1).float()


@pytest.mark.parametrize("chunk", [1, 2, 4, 100])
def test_neighbours_by_hand_and_chunk_invariant(chunk):
    emb = circle()
    assert top_neighbours(emb, 5, chunk=chunk).tolist() == EXPECTED
    assert top_neighbours(emb, 2, chunk=chunk).tolist() == [r[:2] for r in EXPECTED]


def test_a_chunk_of_similarities_stays_under_its_byte_cap(monkeypatch):
    """At COCO's N the chunk shrinks so that chunk x N float32 similarities fit
    SIMILARITY_BYTES (issue 55): here a cap of two rows' worth, the hand-checked answer."""
    from distinctcap.features import neighbours

    emb = circle()
    monkeypatch.setattr(neighbours, "SIMILARITY_BYTES", 2 * 4 * len(emb))
    starts = [s for s, _ in neighbours._chunks(emb, 5, 1024)]
    assert starts == list(range(0, len(emb), 2))
    assert top_neighbours(emb, 5).tolist() == EXPECTED


def test_self_excluded_but_identical_twin_kept():
    emb = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    assert top_neighbours(emb, 1)[:2].tolist() == [[1], [0]]


def test_neighbour_count():
    assert neighbour_count(2000, 0.01) == 20
    assert neighbour_count(240, 0.01) == 3
    assert neighbour_count(118287, 0.01) == 1183
    assert neighbour_count(2, 0.01) == 1
    for n, f in ((1, 0.01), (10, 0.0), (10, 1.5)):
        with pytest.raises(DistinctcapError):
            neighbour_count(n, f)


def test_write_read_and_draw(tmp_path):
    ids = np.array([7, 3, 11, 5, 2, 13])
    path = tmp_path / "train_top40pct.parquet"
    k = write_neighbours(ids, circle(), path, fraction=0.4, chunk=4)  # ceil(0.4 * 5) = 2
    got_ids, got = read_neighbours(path)
    assert k == 2 and got_ids.tolist() == ids.tolist()
    assert got.tolist() == ids[np.array(EXPECTED)[:, :2]].tolist()

    feature_ids = np.array([99, *ids[::-1]])  # feature rows in another order, plus a non-train
    table = NeighbourTable.load(path, feature_ids)
    rows = torch.tensor([1, 6, 6, 6, 6, 6, 6, 6, 6])  # feature row 6 = image 7 -> {3, 11}
    drawn = table.draw(rows, torch.Generator().manual_seed(0))
    assert torch.equal(drawn, table.draw(rows, torch.Generator().manual_seed(0)))
    assert {int(feature_ids[r]) for r in drawn[1:]} == {3, 11}
    assert int(feature_ids[drawn[0]]) in (2, 5)  # image 13's neighbours
    with pytest.raises(DistinctcapError, match="not in the neighbour table"):
        table.draw(torch.tensor([0]), torch.Generator())


def test_non_finite_embeddings_named(tmp_path):
    emb = circle()
    emb[2, 0] = float("nan")
    with pytest.raises(DistinctcapError, match="25"):
        write_neighbours([5, 15, 25, 35, 45, 55], emb, tmp_path / "n.parquet", fraction=0.4)


def test_table_path():
    assert table_path(1) == "results/neighbours/train_top1pct.parquet"
    assert table_path(0.5) == "results/neighbours/train_top0.5pct.parquet"


# ------------------------------------------------------------------ through the real trainer

PRESET_RUNS = yaml.safe_load((ROOT / "presets" / "specificity-ablations.yaml").read_text())["runs"]


@pytest.fixture(scope="module")
def trained_reference(tmp_path_factory, clip, tok):
    """A 3-step MLE reference, the CLIP weights as a file (as the CLIP stage writes them) and
    the neighbour tables the preset's runs ask for."""
    tmp = tmp_path_factory.mktemp("specificity")
    runs = {
        "reference": {"method": "mle"},
        "specificity": {"method": "specificity", "init": "reference", "loss": "ccos"},
        **PRESET_RUNS,
    }
    schema = load_schema(ROOT / "workflow" / "schemas" / "config.schema.yaml")
    config = {
        **validate({"runs": shrink_runs(runs, CLIP_TESTS_TRAIN)}, schema),
        "train": CLIP_TESTS_TRAIN,
        "captioner": CLIP_TESTS_CAPTIONER,
        "device": "cpu",
    }
    feats, data = world(clip, tok)
    run_data = RunData(data, None, tok)
    reference = fit(effective_run_config(config, "reference"), run_data)
    paths = {"init": tmp / "reference.pt", "clip": tmp / "clip.pt", "clip_arch": ARCH}
    reference.model.save(paths["init"])
    distinctcap.train.clip.save_weights(clip, paths["clip"])
    for pct in {r.get("contrastive_top_pct", 1) for r in config["runs"].values()}:
        write_neighbours(feats.image_ids, feats.pooled, tmp / table_path(pct), pct / 100)
    return config, run_data, paths, tmp


@pytest.mark.parametrize("name", ["specificity", *sorted(PRESET_RUNS)])
def test_main_run_and_preset_entries_train(trained_reference, name):
    config, data, paths, tmp = trained_reference
    cfg = effective_run_config(config, name)
    table = tmp / table_path(cfg["contrastive_top_pct"])
    cfg["paths"] = {**{k: str(v) for k, v in paths.items()}, "neighbours": str(table)}
    result = fit(cfg, data)
    assert result.steps == CLIP_TESTS_TRAIN["steps"]
    assert np.isfinite(result.curve["loss"]).all()
    assert {"specificity", "cos_true", "gen_len"} <= set(result.curve)
    assert ("cos_contrast" in result.curve) == (cfg["loss"] in ("cdp", "ccos"))


def test_resumed_mid_run_ends_with_the_uninterrupted_weights(trained_reference):
    """Gumbel noise and contrastive draws are functions of (seed, step, micro-batch), dropout
    uses the torch RNG the checkpoint restores: a resumed run equals an uninterrupted one."""
    config, data, paths, tmp = trained_reference
    cfg = effective_run_config(config, "specificity_gumbel")
    cfg["captioner"] = {**cfg["captioner"], "dropout": 0.1}
    cfg["train"] = {**cfg["train"], "steps": 5}
    table = tmp / table_path(cfg["contrastive_top_pct"])
    cfg["paths"] = {**{k: str(v) for k, v in paths.items()}, "neighbours": str(table)}
    whole = fit(cfg, data)
    cfg["paths"]["out_dir"] = str(tmp / "resumed")
    kill_after(cfg, data, 3)
    resumed = fit(cfg, data)
    assert resumed.resumed_from == 3
    after = resumed.model.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in whole.model.state_dict().items())


def test_loading_a_neighbour_table_maps_its_int32_rows_and_holds_one_row_group(tmp_path):
    """Issue 55: at 123,287 images the specificity job read the 140 million neighbours whole
    as int64 ids, then mapped them to rows (peak 6.2 GB for a 0.56 GB table). Then one row
    group at a time into the int32 table (0.56 GB), held whole: x1.66 the job's RSS at 10,000
    images, numpy's peak at least the table's bytes. Now the rows are written to a file a row
    group at a time and mapped: the same table, numpy's peak under half its bytes."""
    import tracemalloc

    ids = np.arange(4000, dtype=np.int64) * 3 + 1
    emb = torch.nn.functional.normalize(
        torch.randn(4000, 16, generator=torch.Generator().manual_seed(0))
    )
    path = tmp_path / "train_top10pct.parquet"
    write_neighbours(ids, emb, path, fraction=0.1, chunk=256)
    feature_ids = np.concatenate([ids[::-1], [0]])
    tracemalloc.start()
    table = NeighbourTable.load(path, feature_ids)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    whole = NeighbourTable(*read_neighbours(path), feature_ids)
    assert torch.equal(table.neighbours, whole.neighbours) and torch.equal(table.slot, whole.slot)
    assert table.neighbours.dtype == torch.int32 and table.k == 400
    assert peak <= 0.5 * table.neighbours.numel() * 4, peak  # 1.96 MB of 6.4
    assert isinstance(table.file, RowFile)  # draws read their rows from the file
