#!/usr/bin/env node
// make_corpus.js — builds the deterministic text set of the tokenizer conformance test
// (tests/test_tokenizer_conformance.c) as many separate documents, each encoded on its
// own so a mismatch points at one small piece of text.
//
//   node tests/tokenizer/make_corpus.js [out]     (default: tests/tokenizer/build/corpus.bin)
//
// Sources: slices of the public-domain novels in ../shared/corpora/*.txt (read at run time,
// never copied into the repository; when ../shared is absent, generated prose takes their
// place), slices of the project's own source files, and text generated here from a fixed
// seed: numbers, CJK, emoji, odd whitespace, accents in NFC and NFD, contractions, special
// token strings inside text, RTL scripts, Cyrillic/Greek, mixed scripts, long runs.
// The same inputs always give the same bytes.
//
// Output format (binary safe; read by the C test):
//   "kvsieve-tokenizer-corpus 1 <ndocs> <total document bytes>\n"
//   then per document: "doc <index> <nbytes> <class>\n" <nbytes raw UTF-8 bytes> "\n"
'use strict';

const fs = require('fs');
const path = require('path');

const HERE = __dirname;
const ROOT = path.resolve(HERE, '..', '..');
const SHARED = process.env.KS_SHARED ? path.resolve(ROOT, process.env.KS_SHARED)
                                     : path.resolve(ROOT, '..', 'shared');
const OUT = process.argv[2] || path.join(HERE, 'build', 'corpus.bin');
const MIN_BYTES = 200 * 1024;

// ---------------------------------------------------------------- seeded PRNG
// A 32-bit xorshift generator with a Weyl counter added to its output; plenty for picking
// characters, and fully determined by the seed.
let s0 = 1, weyl = 0;
// Each section starts from its own seed, so that what one section draws (the code section
// depends on the files present in the tree) does not shift the text of the others.
function seed(section) {
    s0 = (0x6b767376 ^ Math.imul(section + 1, 0x2545f491)) >>> 0 || 1;
    weyl = 0x9e3779b9 >>> 0;
    for (let i = 0; i < 8; i++) rnd32();
}
function rnd32() {
    s0 ^= s0 << 13; s0 >>>= 0;
    s0 ^= s0 >>> 17;
    s0 ^= s0 << 5; s0 >>>= 0;
    weyl = (weyl + 0x61c88647) >>> 0;
    return (s0 + weyl) >>> 0;
}
const rint = (lo, hi) => lo + (rnd32() % (hi - lo + 1));         // inclusive
const pick = (arr) => arr[rnd32() % arr.length];
const chance = (p) => rnd32() / 4294967296 < p;
const cp = (c) => String.fromCodePoint(c);
const rcp = (lo, hi) => cp(rint(lo, hi));
function repeat(n, f) { let s = ''; for (let i = 0; i < n; i++) s += f(i); return s; }

// ---------------------------------------------------------------- documents
const docs = [];  // {cls, text}
function add(cls, text) {
    if (/[\ud800-\udfff]/.test(text.replace(/[\ud800-\udbff][\udc00-\udfff]/g, '')))
        throw new Error(`internal: lone surrogate in a ${cls} document`);
    docs.push({ cls, text });
}

// Cut a JS string at UTF-16 positions without splitting a surrogate pair.
function safeSlice(s, a, b) {
    const lowSur = (i) => i > 0 && i < s.length && /[\udc00-\udfff]/.test(s[i]);
    while (lowSur(a)) a++;
    while (lowSur(b)) b++;
    return s.slice(a, b);
}

// ---- prose: slices of the novels in ../shared/corpora (or generated prose)
const WORDS = ('the of and to in a is that was he for it with as his on be at by had not are but from ' +
    'or have an they which one you were her all she there would their we him been has when who will ' +
    'more no if out so said what up its about into than them can only other new some could time these ' +
    'two may then do first any my now such like our over man me even most made after also did many ' +
    'before must through back years where much your way well down should because each just those people ' +
    'how too little state good very make world still own see men work long get here between both life ' +
    'being under never day same another know while last might us great old year off come since against ' +
    'go came right used take three himself few house use during without again place American around ' +
    'however home small found Mrs thought went say part once general high upon school every don\'t does ' +
    'got united left number course war until always away something fact though water less public put ' +
    'think almost hand enough far took head yet government system better set told nothing night end why ' +
    'called didn\'t eyes find going look asked later knew point next program city business give group ' +
    'toward young days let room president side social given present several order national possible rather ' +
    'second face per among form important often things looked early white case John become large big need ' +
    'four within felt along children saw best church ever least power development light thing seemed family ' +
    'interest want members mind country area others done turned although open God service certain kind ' +
    'problem began different door thus help sense means whole matter perhaps itself York it\'s times law ' +
    'human line above name example action company hands local show whether five history gave today either ' +
    'act feet across taken past quite anything seen having death week experience body word half really ' +
    'field am car words already themselves I\'m information tell together college shall money period held ' +
    'keep sure probably free seems political real behind cannot miss question air office making brought ' +
    'whose special major heard problems ago became federal moment study available known result street ' +
    'economic boy position reason change south board individual job areas society west close turn love ' +
    'community true court force full seem am Elizabeth Darcy Bennet Emma Knightley Anne Wentworth Ahab ' +
    'Ishmael Queequeg whale harpoon parsonage carriage ballroom estate fortune sensibility persuasion').split(' ');

function genProse(nbytes) {
    let out = '', sentence = 0;
    while (out.length < nbytes) {
        const n = rint(4, 22);
        let s = '';
        for (let i = 0; i < n; i++) {
            let w = pick(WORDS);
            if (i === 0) w = w[0].toUpperCase() + w.slice(1);
            s += (i ? ' ' : '') + w;
            if (i < n - 1 && chance(0.08)) s += pick([',', ';', ' —', ':', ',']);
        }
        if (chance(0.15)) s = '"' + s + pick(['," said ' + pick(['she', 'he', 'Mr. Darcy', 'Emma']) + '.', '!"', '?"', '."']);
        else s += pick(['.', '.', '.', '!', '?', '...']);
        out += s;
        sentence++;
        out += sentence % rint(3, 9) === 0 ? pick(['\n\n', '\r\n\r\n', '\n']) : ' ';
    }
    return out;
}

function proseDocs() {
    let files = [];
    try {
        files = fs.readdirSync(path.join(SHARED, 'corpora')).filter((f) => f.endsWith('.txt')).sort();
    } catch (e) { files = []; }
    let total = 0;
    for (const f of files) {
        const text = fs.readFileSync(path.join(SHARED, 'corpora', f), 'utf8');
        if (text.length < 10000) continue;
        // A slice from the very beginning (Gutenberg header, BOM if any), then random ones of
        // 300..5000 characters starting anywhere (mid-word, mid-line, mid-CRLF).
        add('prose', safeSlice(text, 0, 2000));
        total += 2000;
        for (let k = 0; k < 6; k++) {
            const len = rint(300, 5000), at = rint(0, text.length - len - 1);
            add('prose', safeSlice(text, at, at + len));
            total += len;
        }
    }
    if (files.length === 0 || total < 60000) {
        process.stderr.write(`make_corpus: no novels under ${path.join(SHARED, 'corpora')}; using generated prose\n`);
        for (let k = 0; k < 50; k++) add('prose', genProse(rint(1000, 4000)));
    }
}

// ---- code: the project's own sources plus snippets written here
function codeDocs() {
    const dirs = ['core', 'include', 'tests', 'lua', 'policies', 'repl'];
    let files = [];
    for (const d of dirs) {
        let names = [];
        try { names = fs.readdirSync(path.join(ROOT, d)); } catch (e) { continue; }
        for (const n of names.sort())
            if (/\.(c|h|lua|cu|cuh)$/.test(n)) files.push(path.join(ROOT, d, n));
    }
    let total = 0;
    for (const f of files) {
        if (total > 70000) break;
        let text;
        try { text = fs.readFileSync(f, 'utf8'); } catch (e) { continue; }
        if (text.length < 200) continue;
        // one slice per file, cut at line starts, at most 4000 characters
        const lines = text.split('\n');
        const a = rint(0, Math.max(0, lines.length - 20));
        let s = '';
        for (let i = a; i < lines.length && s.length < 4000; i++) s += lines[i] + '\n';
        add('code', s);
        total += s.length;
    }
    // snippets in other languages, with tabs, 4-space and 2-space indentation, long lines
    const snippets = [
        'def fib(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\nif __name__ == "__main__":\n    print([fib(i) for i in range(20)])\n',
        'function debounce(fn, ms) {\n  let t = null;\n  return (...args) => {\n    clearTimeout(t);\n    t = setTimeout(() => fn.apply(this, args), ms);\n  };\n}\nconst x = { a: 1, "b-c": [1, 2, 3], d: null, e: undefined, f: `tmpl ${1 + 2}` };\n',
        'fn main() {\n\tlet v: Vec<u32> = (0..10).map(|x| x * x).collect();\n\tprintln!("{:?}", v);\n\tmatch v.get(3) {\n\t\tSome(&n) if n > 5 => println!("big {n}"),\n\t\t_ => {}\n\t}\n}\n',
        '{"model":{"type":"BPE","dropout":null,"vocab":{"a":0,"b":1,"ab":2}},"merges":["a b"],"added_tokens":[{"id":3,"content":"<pad>","special":true}],"x":[1.5e-3,-2,true,false]}\n',
        '<!DOCTYPE html>\n<html lang="en">\n  <head><meta charset="utf-8"><title>Test &amp; page</title></head>\n  <body>\n    <p class="x">Hello,&nbsp;<b>world</b>!</p>\n    <script>if (a < b && c > d) { alert("hi"); }</script>\n  </body>\n</html>\n',
        'SELECT u.id, u.name, COUNT(o.id) AS n_orders\nFROM users u\nLEFT JOIN orders o ON o.user_id = u.id\nWHERE u.created_at >= \'2023-01-01\' AND u.email LIKE \'%@example.com\'\nGROUP BY u.id, u.name\nHAVING COUNT(o.id) > 3\nORDER BY n_orders DESC\nLIMIT 10;\n',
        '#!/bin/sh\nset -eu\nfor f in "$@"; do\n  if [ -f "$f" ]; then\n    wc -l < "$f" | awk \'{ s += $1 } END { print s }\'\n  fi\ndone 2>&1 | tee /dev/null\nexport PATH="$HOME/.local/bin:$PATH"\n',
        'local M = {}\nfunction M.score(q, k, n)\n  local out = {}\n  for i = 1, n do out[i] = (q[i] or 0) * (k[i] or 0) end\n  return out -- top-k later\nend\nreturn M\n',
        '| name | size | ok |\n|------|-----:|:--:|\n| a.txt | 1,024 | ✓ |\n| b.bin | 2.5 MiB | ✗ |\n\n```c\nint x = 0x7fffffff; /* max */\n```\n\n* item one\n  * nested `code`\n1. first\n',
        'diff --git a/x.c b/x.c\n--- a/x.c\n+++ b/x.c\n@@ -1,4 +1,5 @@\n #include <stdio.h>\n-int main(void){return 0;}\n+int main(void) {\n+    return printf("%d\\n", 42) < 0;\n+}\n',
        'pub struct Cache<K: Eq + Hash, V> {\n    map: HashMap<K, (V, u64)>,\n}\nimpl<K: Eq + Hash, V: Clone> Cache<K, V> {\n    pub fn get(&self, k: &K) -> Option<V> { self.map.get(k).map(|(v, _)| v.clone()) }\n}\n',
        'template <typename T>\nstd::vector<T> topk(const std::vector<T>& v, size_t k) {\n    std::vector<T> r(v);\n    std::partial_sort(r.begin(), r.begin() + std::min(k, r.size()), r.end(), std::greater<T>());\n    r.resize(std::min(k, r.size()));\n    return r;\n}\n',
    ];
    for (const s of snippets) add('code', s);
    // generated code: deep indentation, long lines, operators
    for (let k = 0; k < 12; k++) {
        let s = '';
        const ind = pick(['\t', '    ', '  ', '        ']);
        for (let i = 0, depth = 0; i < 60; i++) {
            const v = 'v' + rint(0, 99), w = pick(['x', 'y', 'len', 'buf', 'i', 'n', 'ptr->next', 'a[i]']);
            const op = pick(['+=', '-=', '=', '|=', '<<=', '>>=', '^=', '&&', '||', '==', '!=', '<=', '>=', '->', '::', '**', '//', '...']);
            s += ind.repeat(depth) + `${v} ${op} ${w}${pick(['', ' + 1', ' * 0.5f', ' >> 3', '[0]', '()'])};` + (chance(0.2) ? pick(['  // note', ' /* x */', '\t# hash']) : '') + '\n';
            if (chance(0.2) && depth < 8) { s += ind.repeat(depth) + `if (${w} ${op} ${rint(0, 1000)}) {\n`; depth++; }
            else if (chance(0.25) && depth > 0) { depth--; s += ind.repeat(depth) + '}\n'; }
        }
        add('code', s);
    }
}

// ---- numbers
function numberDocs() {
    const digits = (n) => repeat(n, (i) => String(i === 0 && n > 1 ? rint(1, 9) : rint(0, 9)));
    for (let k = 0; k < 30; k++) {
        let s = '';
        for (let i = 0; i < 80; i++) {
            const kind = rint(0, 19);
            let t;
            switch (kind) {
            case 0: t = digits(rint(1, 10)); break;
            case 1: t = '-' + digits(rint(1, 6)) + '.' + digits(rint(1, 6)); break;
            case 2: t = `+${rint(1, 99)} (${digits(3)}) ${digits(3)}-${digits(4)}`; break;
            case 3: t = `${rint(1900, 2099)}-${String(rint(1, 12)).padStart(2, '0')}-${String(rint(1, 28)).padStart(2, '0')}`; break;
            case 4: t = `${rint(1, 28)}/${rint(1, 12)}/${rint(0, 99)}`; break;
            case 5: t = `${rint(0, 23)}:${String(rint(0, 59)).padStart(2, '0')}:${String(rint(0, 59)).padStart(2, '0')}`; break;
            case 6: t = '$' + String(rint(0, 9999999)).replace(/\B(?=(\d{3})+$)/g, ',') + '.' + digits(2); break;
            case 7: t = rint(1, 9) + '.' + digits(rint(1, 4)) + 'e' + pick(['-', '+', '']) + rint(0, 308); break;
            case 8: t = '0x' + rnd32().toString(16).toUpperCase(); break;
            case 9: t = '0b' + rnd32().toString(2); break;
            case 10: t = `${rint(0, 255)}.${rint(0, 255)}.${rint(0, 255)}.${rint(0, 255)}`; break;
            case 11: t = `v${rint(0, 20)}.${rint(0, 99)}.${rint(0, 999)}${pick(['', '-rc.1', '-beta2', '+build.77'])}`; break;
            case 12: t = rint(0, 100) + pick(['%', ' %', '‰', '°C', ' km/h', 'px', 'ms', 'GiB']); break;
            case 13: t = digits(rint(11, 40)); break;
            case 14: t = `${rint(1, 999)} ${digits(3)} ${digits(3)},${digits(2)} €`; break;
            case 15: t = rnd32().toString(16).padStart(8, '0') + '-' + (rnd32() & 0xffff).toString(16).padStart(4, '0') + '-4' + (rnd32() & 0xfff).toString(16).padStart(3, '0'); break;
            case 16: t = `${rint(1, 9)}/${rint(2, 16)}`; break;
            case 17: t = '(' + digits(rint(1, 3)) + ')' + '[' + digits(rint(1, 3)) + ']'; break;
            case 18: t = digits(rint(1, 3)) + pick(['st', 'nd', 'rd', 'th', 'x', 'k', 'M', 'B']); break;
            default: t = '#' + digits(rint(1, 5)); break;
            }
            s += t + pick([' ', ' ', ', ', '\n', '; ', '\t', '', ' = ', ' + ']);
        }
        add('numbers', s);
    }
    // digit runs of every length 1..64, alone and glued to letters
    let runs = '';
    for (let n = 1; n <= 64; n++) runs += digits(n) + (n % 3 ? ' ' : '\n') + 'x' + digits(n) + 'y ';
    add('numbers', runs);
    // non-ASCII numerals: fullwidth, Arabic-Indic, Extended Arabic-Indic, Devanagari, Bengali,
    // Thai, superscripts/subscripts, fractions, Roman numerals, circled numbers
    const uni = [[0xff10, 0xff19], [0x0660, 0x0669], [0x06f0, 0x06f9], [0x0966, 0x096f], [0x09e6, 0x09ef],
        [0x0e50, 0x0e59], [0x2070, 0x2070], [0x2074, 0x2079], [0x2080, 0x2089], [0x00b2, 0x00b3], [0x00bc, 0x00be],
        [0x2150, 0x215e], [0x2160, 0x217f], [0x2460, 0x2473], [0x2776, 0x277f], [0x1d7ce, 0x1d7ff]];
    for (let k = 0; k < 6; k++) {
        let s = '';
        for (let i = 0; i < 120; i++) {
            const r = pick(uni);
            s += repeat(rint(1, 6), () => rcp(r[0], r[1])) + pick([' ', '', '.', ', ', '\n', '5', 'a']);
        }
        add('numbers', s);
    }
    add('numbers', '0\n00\n000\n0000\n1\n12\n123\n1234\n12345\n123456\n1234567\n12345678\n123456789\n1234567890\n' +
        '3.14159265358979323846264338327950288419716939937510\n-0.0 +0.0 1e10 1E-10 .5 5. 1_000_000 1\'000\'000 ' +
        '10,000,000.00 10.000.000,00 ١٢٣ ۱۲۳ ２０２４年１２月３１日 ½ ¾ Ⅻ ⅻ ① ⑳ x² H₂O 2⁶⁴ 3×4=12 7÷2=3.5 ±1 ≈2 ≤3 ≥4 ∞\n');
}

// ---- CJK
const ZH_COMMON = '的一是不了人我在有他这中大来上个国到说们为子和你地出道也时年得就那要下以生会自着去之过家学对' +
    '可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从' +
    '动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很' +
    '业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万' +
    '市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计' +
    '或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认';
const ZH_FIXED = [
    '今天早上下了一场小雨，空气变得很清新。我们决定去公园散步，顺便买一些新鲜的水果。',
    '这个程序的核心是一个分词器，它把文本切成词元，然后交给模型处理。',
    '请问，去火车站怎么走？——一直往前走，到第二个路口向左转就到了。',
    '《红楼梦》是中国古典小说的巅峰之作，共一百二十回。',
    '他说：“我明天不能来了，因为要加班。”她回答：“没关系，下次再约吧！”',
    '人工智能（AI）的发展速度越来越快，2024年出现了很多新的模型。',
];
const JA_FIXED = [
    '吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。',
    '東京駅から新幹線に乗って、京都まで二時間ちょっとで着きます。',
    'このプログラムはトークナイザーのテストです。カタカナ、ひらがな、漢字が混ざっています。',
    'ｶﾀｶﾅの半角文字も、ちゃんと処理できるでしょうか？　全角スペースも入れました。',
    '「ありがとうございます」と彼女は言った。私は少し照れくさかった。',
];
const KO_FIXED = [
    '안녕하세요! 오늘 날씨가 정말 좋네요. 같이 산책하러 갈래요?',
    '이 테스트는 토크나이저가 한국어 문장을 올바르게 처리하는지 확인합니다.',
    '서울에서 부산까지 기차로 약 세 시간 걸립니다.',
    '한글은 세종대왕이 1443년에 창제했습니다.',
];
function cjkDocs() {
    const zhPunct = ['，', '。', '、', '；', '：', '？', '！', '“', '”', '（', '）', '《', '》', '——', '……'];
    for (let k = 0; k < 14; k++) {
        let s = '';
        for (let i = 0; i < 60; i++) {
            if (chance(0.25)) s += pick(ZH_FIXED);
            else s += repeat(rint(2, 20), () => chance(0.8) ? ZH_COMMON[rint(0, ZH_COMMON.length - 1)] : rcp(0x4e00, 0x9fa5)) + pick(zhPunct);
            if (chance(0.15)) s += pick([' ', '\n', 'AI', ' GPU ', '2024', 'abc']);
        }
        add('cjk', s);
    }
    for (let k = 0; k < 10; k++) {
        let s = '';
        for (let i = 0; i < 60; i++) {
            const r = rint(0, 6);
            if (r === 0) s += pick(JA_FIXED);
            else if (r === 1) s += repeat(rint(2, 12), () => rcp(0x3041, 0x3093));
            else if (r === 2) s += repeat(rint(2, 10), () => rcp(0x30a1, 0x30f6)) + (chance(0.3) ? 'ー' : '');
            else if (r === 3) s += repeat(rint(1, 6), () => ZH_COMMON[rint(0, ZH_COMMON.length - 1)]);
            else if (r === 4) s += repeat(rint(2, 8), () => rcp(0xff66, 0xff9d));
            else s += pick(['。', '、', '「', '」', '！', '？', '\u3000', '・', '〜']);
        }
        add('cjk', s);
    }
    for (let k = 0; k < 10; k++) {
        let s = '';
        for (let i = 0; i < 80; i++) {
            if (chance(0.2)) s += pick(KO_FIXED) + ' ';
            else s += repeat(rint(1, 5), () => rcp(0xac00, 0xd7a3)) + pick([' ', ' ', '. ', ', ', '? ', '\n', '']);
        }
        add('cjk', s);
    }
    // 4-byte CJK (Extension B), compatibility ideographs, CJK symbols, fullwidth Latin
    let s = '';
    for (let i = 0; i < 300; i++) {
        const r = rint(0, 3);
        if (r === 0) s += rcp(0x20000, 0x2a6d6);
        else if (r === 1) s += rcp(0x3000, 0x303f);
        else if (r === 2) s += rcp(0xff01, 0xff5e);
        else s += ZH_COMMON[rint(0, ZH_COMMON.length - 1)];
        if (chance(0.1)) s += ' ';
    }
    add('cjk', s);
}

// ---- emoji
function emojiDocs() {
    const ranges = [[0x1f600, 0x1f64f], [0x1f300, 0x1f5ff], [0x1f680, 0x1f6c5], [0x1f910, 0x1f93e], [0x2600, 0x26ff], [0x2700, 0x27bf]];
    const tones = [0x1f3fb, 0x1f3fc, 0x1f3fd, 0x1f3fe, 0x1f3ff];
    const zwj = [
        '👨\u200d👩\u200d👧\u200d👦', '👩\u200d💻', '👨\u200d🚀', '🏳\ufe0f\u200d🌈', '❤\ufe0f\u200d🔥', '🧑\u200d🤝\u200d🧑',
        '👩🏽\u200d🔬', '👁\ufe0f\u200d🗨\ufe0f', '🐕\u200d🦺', '👨🏿\u200d❤\ufe0f\u200d💋\u200d👨🏻', '🏴\u200d☠\ufe0f',
    ];
    const flags = () => cp(0x1f1e6 + rint(0, 25)) + cp(0x1f1e6 + rint(0, 25));
    const england = '🏴\u{e0067}\u{e0062}\u{e0065}\u{e006e}\u{e0067}\u{e007f}';
    const keycap = () => pick(['#', '*', '0', '1', '7', '9']) + '\ufe0f\u20e3';
    for (let k = 0; k < 16; k++) {
        let s = '';
        for (let i = 0; i < 120; i++) {
            const r = rint(0, 9);
            if (r < 3) { const g = pick(ranges); s += rcp(g[0], g[1]); }
            else if (r === 3) s += pick(['👍', '👋', '🙏', '💪', '🤝', '👶', '🧒']) + cp(pick(tones));
            else if (r === 4) s += pick(zwj);
            else if (r === 5) s += flags();
            else if (r === 6) s += pick([keycap(), england, '☺\ufe0f', '☺\ufe0e', '✔\ufe0f', '©\ufe0f', '™']);
            else s += pick([' ', ' ', 'ok ', 'lol', '!!', '\n', ' so good ', 'haha', '.']);
        }
        add('emoji', s);
    }
    add('emoji', '😀'.repeat(200) + '\n' + '👍🏽'.repeat(50) + '\n' + ('👨\u200d👩\u200d👧').repeat(30));
}

// ---- odd whitespace
function whitespaceDocs() {
    const ws = [' ', '  ', '   ', '\t', '\t\t', '\n', '\n\n', '\n\n\n', '\r\n', '\r\n\r\n', '\r', '\u00a0', '\u3000',
        '\u2000', '\u2002', '\u2003', '\u2009', '\u200a', '\u200b', '\u202f', '\u205f', '\u2028', '\u2029', '\u0085',
        '\u000b', '\u000c', ' \n', '\n ', ' \t\n', '\u00a0\u00a0', ' '.repeat(rint(4, 40)), '\n'.repeat(rint(4, 12)),
        '\u1680', '\u180e', '\ufeff'];
    for (let k = 0; k < 24; k++) {
        let s = chance(0.5) ? pick(ws) : '';
        for (let i = 0; i < 150; i++) {
            s += pick(WORDS);
            s += chance(0.5) ? ' ' : pick(ws);
            if (chance(0.05)) s += ' '.repeat(rint(2, 30)) + '\n';
            if (chance(0.03)) s += '\t'.repeat(rint(1, 6));
        }
        s += chance(0.5) ? ' '.repeat(rint(1, 5)) : pick(ws);
        add('whitespace', s);
    }
    // small edge documents
    const edge = ['', ' ', '  ', '\n', '\n\n', '\t', '\r\n', ' a', 'a ', '  a  ', '\n\na', 'a\n\n', ' \n \n ',
        '\u00a0', '\u3000', 'a\u00a0b', 'a\u3000b', '\ufeffBOM at start', 'x\r\ny\r\n\r\nz', 'x\ry\rz',
        'trailing spaces   \nand more    \n', '    leading four\n        eight\n\t\ttabs\n', 'a\u2028b\u2029c\u0085d',
        ' '.repeat(257), '\n'.repeat(100), '\t'.repeat(33), '\r\n'.repeat(40), ' \n'.repeat(50), 'word' + ' '.repeat(100) + 'word'];
    for (const e of edge) add('whitespace', e);
}

// ---- accents and combining marks, NFC and NFD
const ACCENTED = [
    'café', 'naïve', 'résumé', 'fiancée', 'crème brûlée', 'Ångström', 'über', 'Straße', 'Ærøskøbing', 'São Paulo',
    'Ñandú', 'Łódź', 'Dvořák', 'Škoda', 'Kraków', 'Tiếng Việt', 'Nguyễn', 'phở', 'đường', 'İstanbul', 'ığdır',
    'Ελληνικά', 'ἀρχή', 'ῥυθμός', 'Ὀδυσσεύς', 'façade', 'jalapeño', 'coöperate', 'Zoë', 'Brontë', 'Māori', 'ā ē ī ō ū',
    'Ǆ ǅ ǆ', 'ﬁ ﬂ ﬀ', 'Å Ω K', 'क़ ख़ ग़', 'প্রথম', 'ñ', 'ǘ', 'ḝ', 'ệ', 'ỹ', 'ẫ',
];
function accentDocs() {
    for (let k = 0; k < 12; k++) {
        const form = ['NFC', 'NFD', 'mixed'][k % 3];
        let s = '';
        for (let i = 0; i < 150; i++) {
            let w = chance(0.4) ? pick(ACCENTED) : pick(WORDS);
            if (form === 'NFD' || (form === 'mixed' && chance(0.5))) w = w.normalize('NFD');
            else w = w.normalize('NFC');
            s += w + pick([' ', ' ', ', ', '. ', '\n']);
        }
        add('accents', s);
    }
    // base letters with 1..6 random combining marks (incl. reorderable ones: U+0316 below vs U+0301 above)
    for (let k = 0; k < 6; k++) {
        let s = '';
        for (let i = 0; i < 300; i++) {
            s += pick('aeiouAEIOUnczsgkxy'.split(''));
            const m = rint(0, chance(0.1) ? 6 : 2);
            for (let j = 0; j < m; j++) s += rcp(0x0300, 0x036f);
            if (chance(0.15)) s += ' ';
        }
        add('accents', s);
    }
    // singletons and compatibility ideographs that NFC rewrites, composition exclusions,
    // conjoining Hangul jamo that NFC composes, canonical reordering
    let s = '\u212b \u2126 \u212a \u0340\u0341 a\u0301\u0316 a\u0316\u0301 \u0958\u0959 \u0915\u093c ' +
        '\u1100\u1161\u11a8 \u1112\u1161\u11ab\u1100\u1173\u11af \u00c5 A\u030a ';
    for (let i = 0; i < 200; i++) s += rcp(0xf900, 0xfa2d) + (chance(0.2) ? ' ' : '');
    for (let i = 0; i < 100; i++) s += cp(rint(0x1100, 0x1112)) + cp(rint(0x1161, 0x1175)) + (chance(0.5) ? cp(rint(0x11a8, 0x11c2)) : '') + (chance(0.3) ? ' ' : '');
    add('accents', s);
    // Hangul syllables in NFD (decomposed into jamo)
    add('accents', KO_FIXED.join(' ').normalize('NFD'));
    add('accents', ACCENTED.join(' ').normalize('NFD') + '\n' + ACCENTED.join(' ').normalize('NFKC'));
}

// ---- contractions
function contractionDocs() {
    const c = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE", "'M", "'LL", "'D", "'Ll", "'rE", "’s", "’t", "’ll"];
    const fixed = "I'm sure it's fine. We'll see; you'd've known. DON'T SHOUT, IT'S LATE. She'S here, they'RE gone. " +
        "rock'n'roll o'clock 'tis 'twas y'all ma'am can't won't shan't ain't it’s didn’t “quoted” ‘single’ dogs' bones " +
        "''s ''t '' ' s 't '\nO'Brien D'Angelo l'homme qu'il aujourd'hui 5's and 6'll x'sy 's't'll'd";
    add('contractions', fixed);
    for (let k = 0; k < 10; k++) {
        let s = chance(0.5) ? pick(c) + ' ' : '';
        for (let i = 0; i < 200; i++) {
            s += pick(WORDS) + (chance(0.35) ? pick(c) : '') + pick([' ', ' ', ', ', '\n', "' ", ' \'', '']);
        }
        add('contractions', s);
    }
}

// ---- special-token strings inside text
function specialDocs() {
    const sp = ['<|begin_of_text|>', '<|end_of_text|>', '<|eot_id|>', '<|start_header_id|>', '<|end_header_id|>',
        '<|reserved_special_token_0|>', '<|reserved_special_token_17|>', '<|reserved_special_token_250|>', '<|finetune_right_pad_id|>',
        '<s>', '</s>', '<unk>', '<|im_start|>', '<|im_end|>', '<|endoftext|>', '<think>', '</think>', '<tool_call>', '</tool_call>',
        '<|fim_prefix|>', '<|fim_middle|>', '<|vision_start|>', '<|box_end|>',
        // near misses
        '<|begin_of_text|', '<|im_start>', '< s>', '<s >', '<S>', '<<s>>', '</s', '<|endoftext', '<|reserved_special_token_|>', '<|'];
    add('special', '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|>' +
        '<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|>');
    add('special', '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi there!<|im_end|>\n' +
        '<|im_start|>assistant\n<think>\n\n</think>\n\nHello! How can I help?<|im_end|>\n');
    add('special', '<s>[INST] What is the capital of France? [/INST] Paris</s><s>[INST] And Spain? [/INST] Madrid</s>');
    add('special', '<s>');
    add('special', '</s>');
    add('special', ' <s> ');
    add('special', '<s><s></s></s><unk><unk>');
    add('special', '<|endoftext|>');
    add('special', 'abc<s>def</s>ghi<|im_end|>jkl<|eot_id|>mno');
    for (let k = 0; k < 14; k++) {
        let s = chance(0.4) ? pick(sp) : '';
        for (let i = 0; i < 120; i++) {
            s += pick(WORDS);
            if (chance(0.2)) s += pick(['', ' ', '\n', '  ']) + pick(sp) + pick(['', ' ', '\n', '  ']);
            else s += ' ';
        }
        if (chance(0.5)) s += pick(sp);
        add('special', s);
    }
}

// ---- RTL: Arabic, Hebrew, Persian, bidi controls
const AR_FIXED = [
    'مرحبا بكم في هذا الاختبار. نريد أن نتأكد من أن المحلل يعمل بشكل صحيح.',
    'اللغة العربية جميلة، وتكتب من اليمين إلى اليسار.',
    'في عام ٢٠٢٤ زار أكثر من ١٠٠٠ شخص المعرض.',
    'بِسْمِ اللَّهِ الرَّحْمَٰنِ الرَّحِيمِ',
];
const HE_FIXED = ['שלום עולם! זהו מבחן של המפרק.', 'בְּרֵאשִׁית בָּרָא אֱלֹהִים', 'העברית נכתבת מימין לשמאל, והמספרים 123 משמאל לימין.'];
const FA_FIXED = ['سلام، حال شما چطور است؟ امروز هوا خیلی خوب است.', 'این یک آزمایش برای توکنایزر است. ۱۲۳۴'];
function rtlDocs() {
    for (let k = 0; k < 14; k++) {
        let s = '';
        for (let i = 0; i < 80; i++) {
            const r = rint(0, 7);
            if (r === 0) s += pick(AR_FIXED);
            else if (r === 1) s += pick(HE_FIXED);
            else if (r === 2) s += pick(FA_FIXED);
            else if (r === 3) s += repeat(rint(2, 8), () => rcp(0x0621, 0x063a) + (chance(0.2) ? rcp(0x064b, 0x0652) : ''));
            else if (r === 4) s += repeat(rint(2, 7), () => rcp(0x05d0, 0x05ea) + (chance(0.15) ? rcp(0x05b0, 0x05bc) : ''));
            else if (r === 5) s += pick(['\u200f', '\u200e', '\u202b', '\u202c', '\u2067', '\u2069', '\u061c']) + pick(WORDS);
            else s += pick(['، ', '؟ ', '. ', ' ', '\n', ' (abc) ', ' 42 ', '٫', 'ـــ']);
            s += ' ';
        }
        add('rtl', s);
    }
}

// ---- Cyrillic and Greek
const RU_FIXED = [
    'Привет, мир! Это проверка токенизатора на русском языке.',
    'Съешь же ещё этих мягких французских булок, да выпей чаю.',
    'Ёлка, ёжик и объём — буква «ё» часто теряется.',
    'Україна: їжак, ґанок, Київ, ім’я, п\'ять.',
    'Българският език използва кирилица; Србија користи ћирилицу и латиницу.',
];
function cyrillicDocs() {
    for (let k = 0; k < 12; k++) {
        let s = '';
        for (let i = 0; i < 120; i++) {
            const r = rint(0, 5);
            if (r === 0) s += pick(RU_FIXED);
            else if (r <= 2) {
                let w = repeat(rint(2, 10), () => rcp(0x0430, 0x044f));
                if (chance(0.2)) w = w[0].toUpperCase() + w.slice(1);
                if (chance(0.05)) w = w.toUpperCase();
                s += w;
            } else if (r === 3) s += repeat(rint(2, 9), () => rcp(0x03b1, 0x03c9));
            else if (r === 4) s += pick(['ё', 'Ё', 'ї', 'і', 'ґ', 'є', 'ў', 'ђ', 'љ', 'њ', 'ћ', 'џ', 'ά', 'ώ', 'ϊ', 'ΐ']);
            else s += pick([',', '.', ' —', '«', '»', ':', '!', '?']);
            s += pick([' ', ' ', ' ', '\n', '']);
        }
        add('cyrillic', s);
    }
}

// ---- mixed scripts and odd characters
function mixedDocs() {
    const ranges = [[0x0041, 0x007a], [0x00c0, 0x00ff], [0x0100, 0x017f], [0x0391, 0x03a9], [0x0410, 0x044f],
        [0x05d0, 0x05ea], [0x0621, 0x064a], [0x0905, 0x0939], [0x0e01, 0x0e2e], [0x10d0, 0x10fa], [0x0531, 0x0556],
        [0x1200, 0x1248], [0x3041, 0x3093], [0x30a1, 0x30f6], [0x4e00, 0x9fa5], [0xac00, 0xd7a3], [0x2200, 0x22ff],
        [0x2500, 0x257f], [0x2190, 0x21ff], [0x1d400, 0x1d433], [0x1d11e, 0x1d126], [0xe000, 0xe0ff], [0x0021, 0x002f],
        [0x20a0, 0x20bf], [0x2010, 0x2027], [0x0f00, 0x0f3f], [0x1780, 0x17b3], [0x0b85, 0x0b95]];
    for (let k = 0; k < 16; k++) {
        let s = '';
        for (let i = 0; i < 200; i++) {
            const g = pick(ranges);
            s += repeat(rint(1, 7), () => rcp(g[0], g[1]));
            s += pick([' ', ' ', '', '\n', '-', '_', '.', '/', '\t']);
        }
        add('mixed', s);
    }
    add('mixed', 'Thai: ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ Hindi: हिन्दी भाषा देवनागरी लिपि में लिखी जाती है। ' +
        'Georgian: ქართული ენა Armenian: Հայերեն Amharic: አማርኛ Tamil: தமிழ் Khmer: ភាសាខ្មែរ ' +
        'Math: ∀x∈ℝ, ∃y: x²+y²≤1 ⇒ |x|≤1; ∑ᵢ aᵢ = ∫₀¹ f(t) dt 𝐀𝐁𝐂 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛 ' +
        'Box: ┌─┬─┐│ │ │└─┴─┘ Music: 𝄞𝄢 ♩♪♫ Currency: $€£¥₹₽₿ Quotes: «»„“‚‘‹› Dashes: ‐‑‒–—―');
    // controls and unusual code points (NUL, C0/C1 controls, DEL, soft hyphen, ZWJ/ZWNJ,
    // variation selectors, private use, noncharacter-adjacent, replacement character)
    add('mixed', 'nul\u0000byte ctl\u0001\u0002\u0003\u0007\u0008\u001b[31mred\u001b[0m del\u007f c1\u0080\u0081\u009f ' +
        'soft\u00adhyphen zw\u200cnj zw\u200dj word\u2060joiner vs\ufe00\ufe0f pua\ue000\uf8ff\u{f0000}\u{10fffd} ' +
        'repl\ufffd fffc\ufffc tag\u{e0041}\u{e0042} ' + 'x\u0000'.repeat(10));
    // code points assigned only in recent Unicode versions (regex / normalization tables of
    // different Unicode versions may classify them differently)
    add('unicode-new', 'Unicode 13-15: 🫠🫨🫶🪿🫎🩷 \u{1fae8}\u{1fa77} CJK Ext G/H: \u{30000}\u{30001}\u{31350}\u{31351} ' +
        'Kawi: \u{11f04}\u{11f05}\u{11f06} Nag Mundari: \u{1e4d0}\u{1e4d1}\u{1e4d2} Vithkuqi: \u{10570}\u{10571} ' +
        'Toto: \u{1e290}\u{1e291} Cypro-Minoan: \u{12f90}\u{12f91} Kaktovik digits: \u{1d2c0}\u{1d2c1}\u{1d2c2}');
    // digits of Unicode 15 (Kaktovik, Kawi, Nag Mundari) and 16 (Garay, Gurung Khema, Kirat
    // Rai, Sunuwar, Ol Onal, outlined digits): \p{N} for HF's regex engine; the split
    // regexes glue a preceding space to them only if they are not (Llama 3 and Qwen differ)
    const newDigits = [[0x1d2c0, 0x1d2d3], [0x11f50, 0x11f59], [0x1e4f0, 0x1e4f9], [0x10d40, 0x10d49],
        [0x16130, 0x16139], [0x16d70, 0x16d79], [0x11bf0, 0x11bf9], [0x1e5f1, 0x1e5fa], [0x1ccf0, 0x1ccf9]];
    let nd = '';
    for (const r of newDigits) nd += `U+${r[0].toString(16)}: ` + repeat(5, () => rcp(r[0], r[1])) + ' x' + rcp(r[0], r[1]) + '! ' + rcp(r[0], r[1]) + '1\n';
    add('unicode-new', nd);
}

// ---- long runs (stress BPE on long pre-tokens)
function longDocs() {
    add('long', repeat(3000, () => String.fromCharCode(97 + rint(0, 25))));
    add('long', 'a'.repeat(2500));
    add('long', 'ab'.repeat(1200));
    add('long', repeat(2000, () => String(rint(0, 9))));
    add('long', '='.repeat(800) + '\n' + '-'.repeat(800) + '\n' + '.'.repeat(500) + '!?'.repeat(200));
    add('long', 'https://example.com/' + repeat(60, () => pick(WORDS)).replace(/\s/g, '') + '?q=' + repeat(40, () => rnd32().toString(36)) + '#frag');
    add('long', repeat(150, () => rnd32().toString(36)) + ' ' + Buffer.from(repeat(600, () => String.fromCharCode(rint(0, 255))), 'latin1').toString('base64'));
    add('long', repeat(900, () => ZH_COMMON[rint(0, ZH_COMMON.length - 1)]));
    add('long', 'Supercalifragilisticexpialidocious'.repeat(40) + ' ' + 'Donaudampfschifffahrtsgesellschaftskapitän'.repeat(20));
    add('long', '\u00e9'.repeat(700) + ' ' + 'e\u0301'.repeat(700));
    add('long', repeat(400, () => rcp(0x0430, 0x044f)));
}

[proseDocs, codeDocs, numberDocs, cjkDocs, emojiDocs, whitespaceDocs, accentDocs, contractionDocs, specialDocs,
    rtlDocs, cyrillicDocs, mixedDocs, longDocs].forEach((section, i) => { seed(i); section(); });

// ---------------------------------------------------------------- write
const parts = [];
let total = 0;
for (let i = 0; i < docs.length; i++) {
    const b = Buffer.from(docs[i].text, 'utf8');
    parts.push(Buffer.from(`doc ${i} ${b.length} ${docs[i].cls}\n`, 'latin1'), b, Buffer.from('\n', 'latin1'));
    total += b.length;
}
if (total < MIN_BYTES) {
    process.stderr.write(`make_corpus: only ${total} bytes of text, need at least ${MIN_BYTES}\n`);
    process.exit(1);
}
const out = Buffer.concat([Buffer.from(`kvsieve-tokenizer-corpus 1 ${docs.length} ${total}\n`, 'latin1'), ...parts]);
fs.mkdirSync(path.dirname(OUT), { recursive: true });
let same = false;
try { same = fs.readFileSync(OUT).equals(out); } catch (e) { same = false; }
if (!same) fs.writeFileSync(OUT, out);
const byCls = {};
for (const d of docs) byCls[d.cls] = (byCls[d.cls] || 0) + Buffer.byteLength(d.text, 'utf8');
process.stderr.write(`make_corpus: ${docs.length} documents, ${total} bytes (${Object.entries(byCls).map(([k, v]) => `${k} ${v}`).join(', ')})` +
    `${same ? ', unchanged' : ''} -> ${path.relative(process.cwd(), OUT)}\n`);
