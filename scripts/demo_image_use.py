import sys, torch, random
sys.path.insert(0, "scripts"); sys.path.insert(0, "src")
from pathlib import Path
import train_demo as T
from merlin.engine import demo_scenes as ds
from transformers import Qwen3VLForConditionalGeneration
torch.set_num_threads(1)
folder = Path("build/demo-model")
hf = Qwen3VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
enc = T.Encoder(folder)
pad_id = enc.tok.token_id("<|endoftext|>")
for kind in ds.QUESTION_KINDS:
    tot_true = tot_swap = 0.0
    for i in range(6):
        sc, q = ds.eval_case(kind, i)
        sc2, _ = ds.eval_case(kind, i + 100)
        # encode with seed-less path: build manually
        def sample(scene):
            from merlin.engine.vision.preprocess import prepare_pil
            prepared = prepare_pil(ds.draw(scene, 160, 160), enc.pre)
            msgs=[{"role":"user","content":[{"type":"image"},{"type":"text","text":q.text}]}]
            prompt = enc.tok.encode_chat(msgs, add_generation_prompt=True)
            ans = enc.tok.encode_text(q.answer) + [enc.im_end]
            g = prepared.grid_thw; n_pad = g[0]*g[1]*g[2]//4
            at = prompt.index(enc.pad)
            prompt = prompt[:at] + [enc.pad]*n_pad + prompt[at+1:]
            ids = prompt + ans; labels = [-100]*len(prompt) + ans
            return ids, labels, prepared.pixel_values, g
        a = sample(sc); b = sample(sc2)
        swapped = (a[0], a[1], b[2], b[3]) if b[3] == a[3] else None
        with torch.no_grad():
            l1 = hf(**T.batch_tensors([a], pad_id, enc.pad)).loss.item()
            l2 = hf(**T.batch_tensors([swapped], pad_id, enc.pad)).loss.item() if swapped else float('nan')
        tot_true += l1; tot_swap += l2
    print(kind, "loss true image %.3f   other image %.3f" % (tot_true/6, tot_swap/6))
