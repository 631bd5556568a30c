"""Write the synthetic EMR corpus that ships in ``data/``: Chinese electronic-medical-record
notes for disease classification (no patient data), ``vocab.txt`` and the datasheet.

    python scripts/make_emr_corpus.py [DIRECTORY] [--force]

writes the three JSONL splits, ``vocab.txt`` and the datasheet ``README.md`` (default: the
shipped ``data/``, byte for byte; tests/test_emr_data.py checks it). The package reads the
corpus (:mod:`gradaccum_lib.workloads.data`, whose ``LABELS`` are this table's diagnoses, in
order); this script is how it was made. Everything is generated from explicit seeds through
private ``random.Random`` instances, so the global random state is never touched.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from gradaccum_lib.runtime import check_positive_int
from gradaccum_lib.workloads.data import LABELS, corpus_statistics, load_emr_split

#: where the package reads the corpus: this checkout's data/
DATA_DIR = Path(__file__).resolve().parent.parent / "data"
#: the tokenizer's special tokens, first in the vocabulary ([PAD] first: id 0)
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

#: (diagnosis, prior weight, symptoms, signs, tests, drugs, history). Vocabularies overlap on
#: purpose (cough, chest pain, dizziness, abdominal pain ... belong to several diagnoses).
_DIAGNOSES: tuple[tuple[str, float, tuple[str, ...], tuple[str, ...], tuple[str, ...],
                       tuple[str, ...], tuple[str, ...]], ...] = (
    ("高血压", 0.17,
     ("头晕", "头痛", "颈部僵硬", "心悸", "乏力", "视物模糊", "耳鸣"),
     ("血压升高", "心界不大", "心律齐"),
     ("血压165/100mmHg", "心电图示左心室高电压", "尿常规未见异常", "血脂偏高"),
     ("氨氯地平", "缬沙坦", "美托洛尔"),
     ("吸烟史", "家族高血压史")),
    ("2型糖尿病", 0.15,
     ("口干", "多饮", "多尿", "体重下降", "乏力", "视物模糊", "双足麻木"),
     ("双足背动脉搏动减弱", "体型肥胖", "皮肤干燥"),
     ("空腹血糖11.2mmol/L", "糖化血红蛋白8.9%", "尿糖阳性", "血脂偏高"),
     ("二甲双胍", "胰岛素", "阿卡波糖"),
     ("家族糖尿病史", "肥胖史")),
    ("社区获得性肺炎", 0.12,
     ("发热", "咳嗽", "咳黄痰", "胸痛", "气促", "寒战", "乏力"),
     ("右下肺闻及湿啰音", "呼吸音粗", "体温升高"),
     ("胸部CT示右下肺斑片影", "白细胞计数升高", "C反应蛋白升高", "降钙素原升高"),
     ("头孢曲松", "阿奇霉素", "左氧氟沙星"),
     ("受凉史", "吸烟史")),
    ("冠心病", 0.11,
     ("胸闷", "胸痛", "心悸", "气促", "活动耐量下降", "左肩放射痛"),
     ("心律齐", "心界不大", "双肺呼吸音清"),
     ("心电图示ST段压低", "冠脉CTA示前降支狭窄", "肌钙蛋白阴性", "血脂偏高"),
     ("阿司匹林", "阿托伐他汀", "硝酸甘油", "美托洛尔"),
     ("吸烟史", "高血压病史", "糖尿病史")),
    ("慢性胃炎", 0.10,
     ("上腹痛", "腹胀", "反酸", "嗳气", "食欲减退", "恶心"),
     ("上腹部轻压痛", "无反跳痛", "肠鸣音正常"),
     ("胃镜示胃窦黏膜充血", "幽门螺杆菌阳性", "血常规未见异常"),
     ("奥美拉唑", "铝碳酸镁", "莫沙必利"),
     ("饮食不规律", "饮酒史")),
    ("脑梗死", 0.09,
     ("头晕", "言语不清", "一侧肢体无力", "口角歪斜", "行走不稳", "头痛"),
     ("左侧肢体肌力3级", "病理征阳性", "伸舌左偏"),
     ("头颅MRI示右侧基底节区梗死灶", "颈动脉超声示斑块形成", "血脂偏高"),
     ("阿司匹林", "阿托伐他汀", "丁苯酞"),
     ("高血压病史", "糖尿病史", "房颤病史")),
    ("慢性阻塞性肺疾病", 0.08,
     ("咳嗽", "咳白痰", "气促", "喘息", "活动耐量下降", "胸闷"),
     ("桶状胸", "双肺呼吸音减低", "可闻及哮鸣音"),
     ("肺功能示阻塞性通气功能障碍", "胸部CT示肺气肿", "血气分析示二氧化碳分压升高"),
     ("噻托溴铵", "沙美特罗替卡松", "氨茶碱"),
     ("长期吸烟史", "粉尘接触史")),
    ("急性阑尾炎", 0.07,
     ("腹痛", "转移性右下腹痛", "恶心", "呕吐", "发热", "食欲减退"),
     ("麦氏点压痛", "反跳痛", "腹肌紧张"),
     ("白细胞计数升高", "腹部超声示阑尾增粗", "C反应蛋白升高"),
     ("头孢呋辛", "甲硝唑"),
     ("饮食不洁史",)),
    ("慢性心力衰竭", 0.06,
     ("气促", "双下肢水肿", "夜间阵发性呼吸困难", "乏力", "胸闷", "咳嗽"),
     ("颈静脉怒张", "双肺底湿啰音", "双下肢凹陷性水肿"),
     ("心脏超声示射血分数38%", "BNP明显升高", "胸片示心影增大"),
     ("呋塞米", "螺内酯", "沙库巴曲缬沙坦"),
     ("冠心病病史", "高血压病史")),
    ("泌尿系感染", 0.05,
     ("尿频", "尿急", "尿痛", "发热", "腰痛", "下腹不适"),
     ("肾区叩击痛", "下腹部轻压痛"),
     ("尿常规示白细胞阳性", "尿培养示大肠埃希菌", "白细胞计数升高"),
     ("左氧氟沙星", "头孢克肟"),
     ("既往尿路感染史",)),
)


SPLITS: dict[str, tuple[int, int]] = {  # split: (notes, seed)
    "train": (2000, 11), "validation": (300, 12), "test": (300, 13),
}
if tuple(entry[0] for entry in _DIAGNOSES) != LABELS:
    raise RuntimeError("the diagnoses above differ from gradaccum_lib.workloads.data's LABELS, "
                       "which the package reads (labels by index): keep them the same, in the "
                       "same order")
for _split in SPLITS:  # the package's reader refuses a split name it does not know
    try:
        load_emr_split(_split, DATA_DIR / "..")  # a folder without the file: only the name
    except FileNotFoundError:
        pass
    except ValueError as unknown:
        raise RuntimeError(f"the splits above differ from the package's: {unknown}") from None

_SHARED_NOISE = ("睡眠欠佳", "精神可", "饮食尚可", "大小便正常", "体重无明显变化", "精神差")

_ONSETS = ("无明显诱因下", "劳累后", "受凉后", "情绪激动后", "饮食不当后", "晨起时")

_COURSES = (
    "症状反复发作", "症状持续不缓解", "症状逐渐加重", "休息后可稍缓解", "自服药物后效果不佳",
)


_UNITS = ("天", "周", "个月", "年")

_FEBRILE = ("社区获得性肺炎", "急性阑尾炎", "泌尿系感染")

_PERSONAL = ("生于原籍，无疫区接触史", "无烟酒嗜好", "吸烟二十余年，每日十支", "偶有饮酒")

_FAMILY = ("父母体健", "否认家族遗传病史", "母亲有类似病史", "父亲已故，死因不详")

_COURSES_PLAN = ("当前治疗方案", "观察病情变化", "完善相关检查", "对症支持治疗")


def _pick(rng: random.Random, items: Sequence[str], low: int, high: int) -> list[str]:
    return rng.sample(list(items), k=min(len(items), rng.randint(low, high)))


def _emr_note(rng: random.Random, label: int) -> str:
    name, _, symptoms, signs, tests, drugs, history = _DIAGNOSES[label]
    others = [entry for index, entry in enumerate(_DIAGNOSES) if index != label]
    other = rng.choice(others)
    # a third of notes carry one misleading symptom borrowed from another diagnosis
    present = _pick(rng, symptoms, 1, 3)
    if rng.random() < 0.35:
        present.append(rng.choice(other[2]))
    duration = f"{rng.randint(1, 12)}{rng.choice(_UNITS)}"
    sections = [f"主诉：{'、'.join(present[:2])}{duration}。"]
    detail = rng.random()  # lengths vary from a line to several hundred characters
    if detail > 0.15:
        negated = _pick(rng, other[2], 1, 3)
        story = (f"现病史：患者{duration}前{rng.choice(_ONSETS)}出现{'、'.join(present)}，"
                 f"{rng.choice(_COURSES)}。")
        story += "无" + "，无".join(negated) + "。"
        if rng.random() < 0.5:
            story += f"{'，'.join(_pick(rng, _SHARED_NOISE, 1, 3))}。"
        sections.append(story)
    if detail > 0.35:
        denied = _pick(rng, ("肝炎", "结核", "手术", "外伤", "输血", "药物过敏"), 1, 4)
        past = "既往史：否认" + "、".join(denied) + "史"
        if rng.random() < 0.6:
            past += "，有" + rng.choice(history + other[6])
        sections.append(past + "。")
    if detail > 0.45:
        febrile = name in _FEBRILE and rng.random() < 0.8
        temperature = rng.randint(375, 395) if febrile else rng.randint(362, 373)
        systolic = rng.randint(150, 185) if name == "高血压" else rng.randint(100, 150)
        vitals = (f"体格检查：T {temperature / 10:.1f}℃，P {rng.randint(60, 118)}次/分，"
                  f"R {rng.randint(14, 28)}次/分，BP {systolic}/{rng.randint(60, 105)}mmHg。")
        found = _pick(rng, signs, 0, 2) + ([rng.choice(other[3])] if rng.random() < 0.3 else [])
        sections.append(vitals + ("，".join(found) + "。" if found else ""))
    if detail > 0.6:
        results = _pick(rng, tests, 0, 2) + ([rng.choice(other[4])] if rng.random() < 0.3 else [])
        if results:
            sections.append("辅助检查：" + "，".join(results) + "。")
    if detail > 0.8:
        treated = _pick(rng, drugs, 1, 2) + ([rng.choice(other[5])] if rng.random() < 0.3 else [])
        sections.append("诊疗经过：予" + "、".join(treated) + "等治疗。")
    if detail > 0.9:  # the longest notes add personal and family history and a follow-up
        sections.append(f"个人史：{rng.choice(_PERSONAL)}。家族史：{rng.choice(_FAMILY)}。")
        sections.append(f"入院后复查：{'，'.join(_pick(rng, _SHARED_NOISE, 2, 4))}，"
                        f"{'、'.join(present)}较前{rng.choice(('好转', '无明显变化', '减轻'))}，"
                        f"继续{rng.choice(_COURSES_PLAN)}。")
    return "".join(sections)


def _generate_emr_corpus(num_records: int, seed: int) -> list[dict[str, object]]:
    """Return ``num_records`` synthetic EMR notes ``{"id", "text", "label", "diagnosis"}``,
    deterministic in ``seed``; classes are imbalanced by the priors in :data:`_DIAGNOSES`.
    """
    check_positive_int("num_records", num_records)
    rng = random.Random(seed)
    priors = [entry[1] for entry in _DIAGNOSES]
    records = []
    for index in range(num_records):
        label = rng.choices(range(len(_DIAGNOSES)), weights=priors)[0]
        records.append({"id": f"emr-{seed}-{index:05d}", "text": _emr_note(rng, label),
                        "label": label, "diagnosis": LABELS[label]})
    return records


def _build_vocabulary(texts: Iterable[str]) -> list[str]:
    """Return the vocabulary: BERT's special tokens, every character of ``texts`` (sorted),
    and a ``##`` continuation piece for every non-CJK character (digits, letters, symbols),
    so that WordPiece never falls back to [UNK] inside "36.5℃" or "mmHg".
    """
    characters = sorted({char for text in texts for char in text if not char.isspace()})
    pieces = [f"##{char}" for char in characters if not _is_cjk(char)]
    return [*SPECIAL_TOKENS, *characters, *pieces]


def _is_cjk(char: str) -> bool:
    return 0x4E00 <= ord(char) <= 0x9FFF or 0x3400 <= ord(char) <= 0x4DBF


def _write_emr_corpus(directory: str | Path) -> dict[str, Path]:
    """Write the corpus splits as JSONL, ``vocab.txt`` and the datasheet ``README.md`` into
    ``directory``; return the written paths by name.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    splits = {name: _generate_emr_corpus(size, seed) for name, (size, seed) in SPLITS.items()}
    written = {}
    for name, records in splits.items():
        path = directory / f"emr_{name}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
                        encoding="utf-8")
        written[name] = path
    vocabulary = _build_vocabulary(r["text"] for records in splits.values() for r in records)
    written["vocab"] = directory / "vocab.txt"
    written["vocab"].write_text("\n".join(vocabulary) + "\n", encoding="utf-8")
    written["datasheet"] = directory / "README.md"
    written["datasheet"].write_text(_datasheet(splits, len(vocabulary)), encoding="utf-8")
    return written


def _datasheet_tables(splits: Mapping[str, Sequence[Mapping[str, object]]]) -> tuple[str, str]:
    """The datasheet's two tables' rows: notes per diagnosis and split; lengths per split."""
    stats = {name: corpus_statistics(records) for name, records in splits.items()}
    rows = "\n".join(
        f"| {label} | " + " | ".join(str(stats[name]["label_counts"][label]) for name in splits)
        + " |" for label in LABELS
    )
    lengths = "\n".join(
        f"| {name} | {s['records']} | {s['length_min']} | {s['length_median']} | "
        f"{s['length_p90']} | {s['length_max']} |" for name, s in stats.items()
    )
    return rows, lengths


def _datasheet(splits: Mapping[str, Sequence[Mapping[str, object]]], vocab_size: int) -> str:
    """The corpus's README.md: how it was made, its labels and lengths, its license."""
    rows, lengths = _datasheet_tables(splits)
    longest = 2 + max(len("".join(str(r["text"]).split()))
                      for records in splits.values() for r in records)
    seeds = ", ".join(f"{n} = {size} notes (seed {seed})" for n, (size, seed) in SPLITS.items())
    return f"""# EMR corpus: datasheet

Synthetic Chinese electronic-medical-record (EMR) notes for disease classification, made for
the gradaccum series. **No patient data**: every note is generated by
`scripts/make_emr_corpus.py` from vocabularies of symptoms,
signs, tests, drugs and history per diagnosis, and this file is generated with it
(`python scripts/make_emr_corpus.py data` rewrites `data/` byte for byte; a test
checks it).

## How it was made

Each note has a chief complaint (主诉) and, with decreasing probability, a history of present
illness (现病史) with negations (无…), past history (既往史, 否认…), a physical examination
(体格检查) with vital signs, auxiliary tests (辅助检查) and treatment (诊疗经过). Symptom, sign,
test and drug vocabularies overlap between diagnoses, a third of notes carry a misleading
finding borrowed from another diagnosis, negated findings name other diagnoses' symptoms,
and the classes are imbalanced, so the task is learnable but not trivial.

Splits and seeds: {seeds}.
Vocabulary: `vocab.txt`, {vocab_size} entries (BERT special tokens, every character, `##`
pieces for non-CJK characters).

## Labels (notes per split)

| diagnosis | {" | ".join(splits)} |
|---|{"---|" * len(splits)}
{rows}

## Lengths (characters)

| split | notes | min | median | 90th percentile | max |
|---|---|---|---|---|---|
{lengths}

In tokens: the vocabulary holds one token per character (CJK characters, and `##` pieces for
the others), so a note is its count of non-space characters plus `[CLS]` and `[SEP]`: the
longest note is {longest} tokens (a test checks this with the shipped tokenizer). The article
this series answers uses records of 512 tokens; `python -m recipes.emr_classification.train
--max-length 512` pads these notes to that length.

## License

Generated data, released under CC0 1.0 (public domain dedication), like the generator's MIT
code it comes from. Not for clinical use: the notes are plausible in form, not in medicine.
"""


# the files :func:`_write_emr_corpus` writes, and the only ones its command overwrites
_CORPUS_FILES = ("emr_train.jsonl", "emr_validation.jsonl", "emr_test.jsonl", "vocab.txt",
                "README.md")


def main(argv: Sequence[str] | None = None) -> int:
    """The command: write the corpus where only its files are (or none), unless --force."""
    parser = argparse.ArgumentParser(
        prog="python scripts/make_emr_corpus.py",
        description="Write the synthetic EMR corpus (three JSONL splits, vocab.txt and the "
                    "datasheet README.md) into DIRECTORY.")
    parser.add_argument("directory", nargs="?", default=str(DATA_DIR),
                        help=f"where to write (default: the shipped {DATA_DIR})")
    parser.add_argument("--force", action="store_true",
                        help="also write into a directory that holds other files (its "
                             "README.md is overwritten)")
    arguments = parser.parse_args(argv)
    directory = Path(arguments.directory)
    if directory.exists() and not directory.is_dir():
        parser.error(f"{directory} exists and is not a directory")
    others = sorted(p.name for p in directory.iterdir() if p.name not in _CORPUS_FILES or (
        p.name == "README.md" and not p.read_text(errors="replace").startswith(
            "# EMR corpus: datasheet"))) if directory.is_dir() else []  # a README of its own
    if others and not arguments.force:
        parser.error(f"{directory} holds files that are not the corpus ({', '.join(others[:5])}"
                     f"{', ...' if len(others) > 5 else ''}), and writing would overwrite its "
                     "README.md; give an empty or new directory, or pass --force")
    for label, path in _write_emr_corpus(directory).items():
        print(f"{label}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
